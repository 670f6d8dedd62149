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

/// A table through the library alone: `load_table` splits and standardises it, and a
/// linear model sampled by SGHMC with the noise precision Gibbs-drawn (`GaussianNoise`,
/// `gibbs_step`) fits it as least squares does: diabetes' standardised test RMSE is
/// ≈ 0.70 for ordinary least squares on this split (R² ≈ 0.5); a sampler that did not
/// learn stays at ≈ 1.0. τ settles near 1/(training residual variance) ≈ 2.
#[test]
fn a_table_split_and_standardised_is_sampled_through_the_library() {
    use bnn_core::{Config, GaussianNoise, Noise, Optimizer, Sghmc, SghmcParams};
    use candle_core::{DType, Device, Tensor, Var};
    let Some(dir) = tabular() else { return };
    let ds = bnn_core::load_table(dir.join("diabetes.csv"), "progression", 0.2, 0).unwrap();
    assert!(ds.task.is_regression());
    let (train, test) = (&ds.train, &ds.test);
    let d = train.dim();
    assert_eq!((train.len() + test.len(), d), (442, 10));
    let tensor = |s: &bnn::data::Split| {
        let rows: Vec<usize> = (0..s.len()).collect();
        let (mut x, mut y, mut v) = (Vec::new(), Vec::new(), Vec::new());
        s.gather(&rows, &mut x, &mut y);
        s.gather_values(&rows, &mut v);
        let dev = Device::Cpu;
        (
            Tensor::from_vec(x, (s.len(), d), &dev).unwrap(),
            Tensor::from_vec(v, (s.len(), 1), &dev).unwrap(),
        )
    };
    let (x, y) = tensor(train);
    // Standardised by the training rows: each feature's mean 0 and sd 1 there.
    let mean = x.mean(0).unwrap().to_vec1::<f32>().unwrap();
    let sd = x.sqr().unwrap().mean(0).unwrap().to_vec1::<f32>().unwrap();
    assert!(mean.iter().all(|m| m.abs() < 1e-4), "{mean:?}");
    assert!(sd.iter().all(|s| (s - 1.0).abs() < 1e-3), "{sd:?}");

    let w = Var::zeros((d, 1), DType::F32, &Device::Cpu).unwrap();
    let b = Var::zeros(1, DType::F32, &Device::Cpu).unwrap();
    let predict = |x: &Tensor| {
        x.matmul(w.as_tensor())
            .unwrap()
            .broadcast_add(b.as_tensor())
            .unwrap()
    };
    let n = train.len();
    let config = Config {
        dynamics: SghmcParams {
            lr: 0.01,
            ..Default::default()
        },
        seed: 3,
        ..Config::new(n)
    };
    let mut opt = Sghmc::new(vec![w.clone(), b.clone()], config).unwrap();
    let mut noise = GaussianNoise::new(Noise::DEFAULT).unwrap();
    for step in 1..=3000 {
        opt.backward_step(&noise.nll(&predict(&x), &y).unwrap())
            .unwrap();
        if step % 100 == 0 {
            let sse = (predict(&x) - &y)
                .unwrap()
                .sqr()
                .unwrap()
                .sum_all()
                .unwrap();
            let sse = sse.to_scalar::<f32>().unwrap() as f64;
            opt.gibbs_step(Some((&mut noise, sse))).unwrap();
        }
    }
    let (tx, ty) = tensor(test);
    let rmse = (predict(&tx) - &ty)
        .unwrap()
        .sqr()
        .unwrap()
        .mean_all()
        .unwrap();
    let rmse = (rmse.to_scalar::<f32>().unwrap() as f64).sqrt();
    assert!(rmse < 0.8, "test RMSE {rmse} (standardised)");
    assert!(
        (1.2..3.5).contains(&noise.precision),
        "τ = {}",
        noise.precision
    );
}
