//! Tables from CSV: the shared tabular sets read with their shapes, gzip read as plain
//! text is, and a gzip stream whose trailer declares 2 GB of 10 bytes refused in one line.

use std::path::PathBuf;

use bnn::data::table::{read_csv, Table};

use crate::common::gzip;

/// `$BNN_DATA_DIR/tabular`, or `None` (a failure under `BNN_REQUIRE_DATA=1`).
fn tabular() -> Option<PathBuf> {
    let required = std::env::var("BNN_REQUIRE_DATA").is_ok_and(|v| v == "1");
    let dir = std::env::var_os("BNN_DATA_DIR").map(|d| PathBuf::from(d).join("tabular"));
    match dir {
        Some(d) if d.join("diabetes.csv").is_file() => Some(d),
        other => {
            assert!(
                !required,
                "BNN_REQUIRE_DATA=1 but no tabular/ under BNN_DATA_DIR ({other:?})"
            );
            eprintln!(
                "NOTE: tabular/ not found under BNN_DATA_DIR; the shared tables were not read"
            );
            None
        }
    }
}

#[test]
fn the_shared_tables_read_with_their_shapes() {
    let Some(dir) = tabular() else { return };
    let cases = [
        ("diabetes.csv", "progression", 442, 10),
        ("breast-cancer.csv", "malignant_is_0", 569, 30),
        ("digits-8x8.csv", "digit", 1797, 64),
        ("friedman1-train.csv", "y", 10_000, 10),
        ("friedman1-test.csv", "y", 10_000, 10),
    ];
    for (file, target, rows, features) in cases {
        let t = read_csv(&dir.join(file), target).unwrap();
        assert_eq!((t.rows(), t.features.len()), (rows, features), "{file}");
        assert_eq!(t.x.len(), rows * features, "{file}");
    }
    let digits = read_csv(&dir.join("digits-8x8.csv"), "digit").unwrap();
    let mut classes: Vec<i64> = digits.y.iter().map(|&v| v as i64).collect();
    classes.sort_unstable();
    classes.dedup();
    assert_eq!(classes, (0..10).collect::<Vec<_>>());
}

#[test]
fn gzip_reads_as_plain_text_and_a_lying_trailer_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let text = b"a,y\n1,2\n3,4\n";
    let (plain, gz) = (dir.path().join("t.csv"), dir.path().join("t.csv.gz"));
    std::fs::write(&plain, text).unwrap();
    std::fs::write(&gz, gzip(text)).unwrap();
    let a: Table = read_csv(&plain, "y").unwrap();
    assert_eq!(a, read_csv(&gz, "y").unwrap());

    // Ten bytes of CSV whose gzip trailer declares 2 GB (ISIZE = 2³¹).
    let mut lying = gzip(b"a,y\n10,20\n");
    let n = lying.len();
    lying[n - 4..].copy_from_slice(&(1u32 << 31).to_le_bytes());
    let path = dir.path().join("lying.csv.gz");
    std::fs::write(&path, lying).unwrap();
    let err = read_csv(&path, "y").unwrap_err().to_string();
    assert!(err.starts_with(&path.display().to_string()), "{err}");
    assert!(err.contains("cannot read"), "{err}");
    assert!(!err.contains('\n'), "{err}");
}
