//! `bnn predict`: a test digit saved as a PNG is classified as its label, at 28×28 and at
//! 1000×1000 (inverted, in colour; and as a JPEG); a file that is no image gets one line
//! and exit 1.

use crate::common;

use std::path::Path;

use common::{bnn, fails_with, last_json, real_data, run_ok, short_mnist_run, stderr, stdout};

/// Writes a PNG of `width × height` grey (or RGB) pixels.
fn write_png(path: &Path, width: u32, height: u32, rgb: bool, data: &[u8]) {
    let file = std::fs::File::create(path).unwrap();
    let mut enc = png::Encoder::new(std::io::BufWriter::new(file), width, height);
    enc.set_color(if rgb {
        png::ColorType::Rgb
    } else {
        png::ColorType::Grayscale
    });
    enc.set_depth(png::BitDepth::Eight);
    enc.write_header().unwrap().write_image_data(data).unwrap();
}

/// Image `i` of an IDX images file and its label.
fn test_digit(dir: &Path, i: usize) -> (Vec<u8>, u8) {
    let read = |name: &str| {
        let mut out = Vec::new();
        let f = std::fs::File::open(dir.join(name)).unwrap();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(f), &mut out).unwrap();
        out
    };
    let images = read("t10k-images-idx3-ubyte.gz");
    let labels = read("t10k-labels-idx1-ubyte.gz");
    (
        images[16 + 784 * i..16 + 784 * (i + 1)].to_vec(),
        labels[8 + i],
    )
}

/// One epoch of the default MLP on MNIST (seed 1, about 97%); test image 0 (a 7).
#[test]
fn predict_classifies_a_saved_test_digit_at_any_size() {
    let Some(mnist) = real_data("mnist") else {
        return;
    };
    let d = tempfile::tempdir().unwrap();
    short_mnist_run(d.path(), &mnist, 1, "m");
    let (digit, label) = test_digit(&mnist, 0);
    write_png(&d.path().join("d28.png"), 28, 28, false, &digit);
    // 1000×1000, nearest neighbour; and dark ink on white, in colour.
    let big: Vec<u8> = (0..1000 * 1000)
        .map(|o| digit[(o / 1000) * 28 / 1000 * 28 + (o % 1000) * 28 / 1000])
        .collect();
    write_png(&d.path().join("d1000.png"), 1000, 1000, false, &big);
    let paper: Vec<u8> = big.iter().flat_map(|&v| [255 - v; 3]).collect();
    write_png(&d.path().join("paper.png"), 1000, 1000, true, &paper);
    // And as a JPEG (lossy: the digit survives its artefacts).
    image::GrayImage::from_raw(1000, 1000, big.clone())
        .unwrap()
        .save_with_format(d.path().join("d1000.jpg"), image::ImageFormat::Jpeg)
        .unwrap();
    let idx = mnist.join("t10k-images-idx3-ubyte.gz");
    let out = bnn(
        d.path(),
        &[
            "predict",
            "--run",
            "checkpoints/m",
            "d28.png",
            "d1000.png",
            "paper.png",
            "d1000.jpg",
            "--idx",
            idx.to_str().unwrap(),
            "--index",
            "0",
            "--json",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let notes = stderr(&out);
    assert!(
        notes.contains("d1000.png: resized from 1000×1000 to 28×28"),
        "{notes}"
    );
    assert!(
        notes.contains("paper.png: light background: inverted"),
        "{notes}"
    );
    let p = last_json(&out);
    let p = p.as_array().unwrap();
    assert_eq!(p.len(), 5);
    for q in p {
        assert_eq!(q["class"], label as u64, "{q}");
        assert!(q["probability"].as_f64().unwrap() > 0.9, "{q}");
        let sum: f64 = q["probabilities"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .sum();
        assert!((sum - 1.0).abs() < 1e-5);
        assert!(q["mutual_information"].as_f64().unwrap() >= -1e-12);
    }
    // The PNG of the image and the image from the IDX file are the same pixels.
    assert_eq!(p[0]["probabilities"], p[4]["probabilities"]);

    let table = bnn(d.path(), &["predict", "--run", "checkpoints/m", "d28.png"]);
    assert!(table.status.success(), "{}", stderr(&table));
    let text = stdout(&table);
    assert!(
        text.lines().nth(1).unwrap().starts_with("d28.png"),
        "{text}"
    );
}

#[test]
fn predict_rejects_files_that_are_no_images() {
    let d = tempfile::tempdir().unwrap();
    let mini = [
        "--dataset",
        "mnist-mini",
        "--epochs",
        "1",
        "--burnin",
        "0",
        "--thin",
        "60",
    ];
    run_ok(
        d.path(),
        &[&["train", "--run-name", "r"], &mini[..]].concat(),
    );
    std::fs::write(d.path().join("empty.png"), "").unwrap();
    std::fs::write(
        d.path().join("notes.png"),
        "a text file with a picture's name\n",
    )
    .unwrap();
    let predict = ["predict", "--run", "checkpoints/r"];
    fails_with(
        d.path(),
        &[&predict[..], &["empty.png"]].concat(),
        &["empty.png", "empty file, not an image"],
    );
    fails_with(
        d.path(),
        &[&predict[..], &["notes.png"]].concat(),
        &["notes.png", "not a PNG or JPEG image"],
    );
    fails_with(d.path(), &predict, &["needs an IMAGE"]);
}
