//! The datasets `bnn` knows: file names, checksums of the decompressed content, mirrors.

/// One IDX file of a dataset and the SHA-256 of its decompressed content.
#[derive(Debug, Clone, Copy)]
pub struct FileSpec {
    /// Base name without `.gz`, e.g. `train-images-idx3-ubyte`.
    pub name: &'static str,
    /// SHA-256 of the uncompressed content (header and data).
    pub raw_sha256: &'static str,
}

/// A dataset: its four files, where to download them, and system folders that may hold them.
#[derive(Debug, Clone, Copy)]
pub struct DatasetSpec {
    /// The name a user types (`--dataset`).
    pub name: &'static str,
    /// Train images, train labels, test images, test labels.
    pub files: [FileSpec; 4],
    /// Base URLs to download the files from, in order.
    pub mirrors: &'static [&'static str],
    /// Folders where a system package puts the files.
    pub system_dirs: &'static [&'static str],
    /// The Debian package that installs it, if any.
    pub apt_package: Option<&'static str>,
}

/// Index of the training images in `files`.
pub const TRAIN_IMAGES: usize = 0;
/// Index of the training labels in `files`.
pub const TRAIN_LABELS: usize = 1;
/// Index of the test images in `files`.
pub const TEST_IMAGES: usize = 2;
/// Index of the test labels in `files`.
pub const TEST_LABELS: usize = 3;

const fn f(name: &'static str, raw_sha256: &'static str) -> FileSpec {
    FileSpec { name, raw_sha256 }
}

/// MNIST: 60,000 training and 10,000 test handwritten digits, 28 × 28.
pub const MNIST: DatasetSpec = DatasetSpec {
    name: "mnist",
    files: [
        f(
            "train-images-idx3-ubyte",
            "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db",
        ),
        f(
            "train-labels-idx1-ubyte",
            "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5",
        ),
        f(
            "t10k-images-idx3-ubyte",
            "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7",
        ),
        f(
            "t10k-labels-idx1-ubyte",
            "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2",
        ),
    ],
    mirrors: &[
        "https://ossci-datasets.s3.amazonaws.com/mnist",
        "https://storage.googleapis.com/cvdf-datasets/mnist",
        "http://yann.lecun.com/exdb/mnist",
    ],
    system_dirs: &[],
    apt_package: None,
};

/// Fashion-MNIST: 60,000 training and 10,000 test clothing images, 28 × 28.
pub const FASHION_MNIST: DatasetSpec = DatasetSpec {
    name: "fashion-mnist",
    files: [
        f(
            "train-images-idx3-ubyte",
            "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888",
        ),
        f(
            "train-labels-idx1-ubyte",
            "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9",
        ),
        f(
            "t10k-images-idx3-ubyte",
            "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b",
        ),
        f(
            "t10k-labels-idx1-ubyte",
            "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34",
        ),
    ],
    mirrors: &[
        "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com",
        "https://raw.githubusercontent.com/zalandoresearch/fashion-mnist/master/data/fashion",
    ],
    system_dirs: &["/usr/share/datasets/fashion-mnist"],
    apt_package: Some("dataset-fashion-mnist"),
};

/// The built-in quick-start subset: the first 10,000 MNIST training images and the
/// 10,000 test images, shipped in `data/mnist-mini/` (this crate's; the repository's top-level `data/mnist-mini` links to it) and embedded in the binary.
pub const MNIST_MINI: DatasetSpec = DatasetSpec {
    name: "mnist-mini",
    files: [
        f(
            "train-images-idx3-ubyte",
            "2889698e6bc3614913e76901316712919d1998fc2b44512451bfe65bc1e668b1",
        ),
        f(
            "train-labels-idx1-ubyte",
            "651e38e2ac0632f5113ec18f1df4977117f953197819034009971a6675a0df78",
        ),
        MNIST.files[TEST_IMAGES],
        MNIST.files[TEST_LABELS],
    ],
    mirrors: &[],
    system_dirs: &[],
    apt_package: None,
};

/// Every known dataset.
pub const ALL: [DatasetSpec; 3] = [MNIST, FASHION_MNIST, MNIST_MINI];

/// Looks a dataset up by name.
pub fn lookup(name: &str) -> Option<DatasetSpec> {
    ALL.iter().copied().find(|d| d.name == name)
}

/// The embedded bytes (gzipped IDX) of the built-in subset, in `files` order.
pub(crate) fn mini_bytes() -> [&'static [u8]; 4] {
    [
        include_bytes!("../../data/mnist-mini/train-images-idx3-ubyte.gz"),
        include_bytes!("../../data/mnist-mini/train-labels-idx1-ubyte.gz"),
        include_bytes!("../../data/mnist-mini/t10k-images-idx3-ubyte.gz"),
        include_bytes!("../../data/mnist-mini/t10k-labels-idx1-ubyte.gz"),
    ]
}
