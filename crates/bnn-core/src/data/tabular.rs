//! A table as a [`Dataset`]: the training and test rows (a test file, or a seeded split
//! recorded by its rows), features standardised with the training rows' statistics,
//! the task (classification or regression) and, for regression, the targets standardised.
//! What was done is a [`TableOrigin`] in `run.json`, from which `bnn eval` rebuilds the
//! very same test rows.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::table::{read_csv, Table};
use super::{Dataset, Split, Task};
use crate::error::{Error, Result};

/// What the target column is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum TaskKind {
    /// Classes 0 … k − 1 when every target is such an integer (k ≤ 100), else a regression.
    Auto,
    /// A real value under a Gaussian likelihood.
    Regression,
    /// Integer labels 0 … k − 1 (k ≥ 2) under a softmax.
    Classification,
}

/// How to make a dataset of a CSV file (`bnn train --csv`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TableSpec {
    /// The training table (all rows when split).
    pub csv: PathBuf,
    /// The target column.
    pub target: String,
    /// What the target is.
    pub task: TaskKind,
    /// A separate test table; else a split of `csv`.
    pub test_csv: Option<PathBuf>,
    /// The test fraction of a split.
    pub test_fraction: f64,
    /// The split's seed.
    pub split_seed: u64,
    /// Train on the first N training rows only (in file order, after the split); the
    /// standardisation is that of those rows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub train_limit: Option<usize>,
}

impl TableSpec {
    /// A seeded split of one CSV file: `test_fraction` of its rows for testing, the task
    /// read off the target column (classes when every target is a small integer).
    pub fn split(csv: impl Into<PathBuf>, target: &str, test_fraction: f64, seed: u64) -> Self {
        TableSpec {
            csv: csv.into(),
            target: target.into(),
            task: TaskKind::Auto,
            test_csv: None,
            test_fraction,
            split_seed: seed,
            train_limit: None,
        }
    }
}

/// A CSV table as a dataset ready to train on: split by `seed`, the features (and a
/// regression's target) standardised by the training rows' mean and standard deviation,
/// as `bnn train --csv` does; [`Dataset::table`] records the statistics, to map
/// predictions back to the target's units.
pub fn load_table(
    csv: impl Into<PathBuf>,
    target: &str,
    test_fraction: f64,
    seed: u64,
) -> Result<Dataset> {
    load(&TableSpec::split(csv, target, test_fraction, seed))
}

/// Where a table came from and how it became a dataset, as `run.json` records it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TableOrigin {
    /// What was asked.
    #[serde(flatten)]
    pub spec: TableSpec,
    /// The feature columns, in order.
    pub features: Vec<String>,
    /// Of a split: the test rows (0-based data rows of `csv`, the header not counted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test_rows: Option<Vec<usize>>,
    /// Each feature's training mean and standard deviation (1 for a constant column):
    /// x_std = (x − mean)/std.
    pub feature_mean: Vec<f64>,
    /// See `feature_mean`.
    pub feature_std: Vec<f64>,
}

impl TableOrigin {
    /// Standardised features of raw rows `x` (row-major, one value per feature).
    pub fn standardise(&self, x: &[f64]) -> Vec<f32> {
        let d = self.feature_mean.len().max(1);
        x.chunks_exact(d)
            .flat_map(|row| {
                row.iter()
                    .zip(self.feature_mean.iter().zip(&self.feature_std))
                    .map(|(&v, (&m, &s))| ((v - m) / s) as f32)
            })
            .collect()
    }

    /// Whether two runs' tables give the same training and test rows, standardised alike
    /// (the split seed of a run with a test file does not matter).
    pub fn same_rows(&self, other: &TableOrigin) -> bool {
        let (a, b) = (&self.spec, &other.spec);
        a.csv == b.csv
            && a.target == b.target
            && a.test_csv == b.test_csv
            && self.test_rows == other.test_rows
            && self.features == other.features
            && self.feature_mean == other.feature_mean
            && self.feature_std == other.feature_std
    }

    /// Checks that `ds` (rebuilt from this origin) has the recorded test rows: the CSV
    /// file changed otherwise, and the run's numbers would be on other rows.
    pub fn check_same_split(&self, ds: &Dataset) -> Result<()> {
        let rebuilt = ds.table.as_ref().and_then(|t| t.test_rows.as_ref());
        if rebuilt != self.test_rows.as_ref() {
            return Err(Error::Data(format!(
                "{}: the test rows differ from those the run recorded (the file changed?)",
                self.spec.csv.display()
            )));
        }
        Ok(())
    }
}

/// The prefix of a built-in toy's name in place of a CSV path (`toy:regression-1d`).
pub const TOY_PREFIX: &str = "toy:";

/// Reads and splits the table of `spec` into a dataset (or makes the built-in toy it
/// names, seeded with its split seed).
pub fn load(spec: &TableSpec) -> Result<Dataset> {
    if let Some(name) = spec.csv.to_str().and_then(|p| p.strip_prefix(TOY_PREFIX)) {
        let (train, test) = super::toy::make(name, spec.split_seed)?;
        let mut ds = build(spec, first_rows(spec, train)?, test, None)?;
        ds.name = name.to_string();
        ds.source = "built-in".into();
        return Ok(ds);
    }
    let all = read_csv(&spec.csv, &spec.target)?;
    let (train, test, test_rows) = match &spec.test_csv {
        Some(path) => {
            let test = read_csv(path, &spec.target)?;
            if test.features != all.features {
                return Err(Error::Data(format!(
                    "{}: its columns differ from {}'s",
                    path.display(),
                    spec.csv.display()
                )));
            }
            (all, test, None)
        }
        None => {
            let (train, test, rows) = all.split(spec.test_fraction, spec.split_seed)?;
            (train, test, Some(rows))
        }
    };
    build(spec, first_rows(spec, train)?, test, test_rows)
}

/// The first `spec.train_limit` rows of `train` (all without a limit).
fn first_rows(spec: &TableSpec, train: Table) -> Result<Table> {
    match spec.train_limit {
        None => Ok(train),
        // Two rows at least: a standard deviation needs them.
        Some(n) if n >= 2 && n <= train.rows() => Ok(train.select(&(0..n).collect::<Vec<_>>())),
        Some(n) => Err(Error::Config(format!(
            "--train-limit {n}: there are {} training rows; give 2 to {}",
            train.rows(),
            train.rows()
        ))),
    }
}

/// The dataset of `train` and `test` as `spec` asks.
pub fn build(
    spec: &TableSpec,
    train: Table,
    test: Table,
    test_rows: Option<Vec<usize>>,
) -> Result<Dataset> {
    let task = task_of(spec, &train, &test)?;
    let d = train.features.len();
    let (feature_mean, feature_std) = column_stats(&train.x, d);
    let origin = TableOrigin {
        spec: spec.clone(),
        features: train.features.clone(),
        test_rows,
        feature_mean,
        feature_std,
    };
    let split_of = |t: &Table| -> Split {
        let x = origin.standardise(&t.x);
        match task {
            Task::Classification { .. } => {
                Split::of_table(x, d, t.y.iter().map(|&v| v as u8).collect(), Vec::new())
            }
            Task::Regression { mean, std } => {
                let y = t.y.iter().map(|&v| ((v - mean) / std) as f32).collect();
                Split::of_table(x, d, Vec::new(), y)
            }
        }
    };
    let (train, test) = (split_of(&train), split_of(&test));
    let name = spec
        .csv
        .file_name()
        .map(|f| {
            f.to_string_lossy()
                .trim_end_matches(".gz")
                .trim_end_matches(".csv")
                .to_string()
        })
        .unwrap_or_else(|| "table".into());
    Ok(Dataset {
        name,
        source: spec.csv.display().to_string(),
        train,
        valid: None,
        test,
        task,
        table: Some(origin),
    })
}

/// Each column's mean and population standard deviation (1 where it is constant, so that
/// a constant feature stays 0 rather than dividing by 0).
fn column_stats(x: &[f64], d: usize) -> (Vec<f64>, Vec<f64>) {
    let n = (x.len() / d.max(1)).max(1) as f64;
    let mut mean = vec![0.0; d];
    for row in x.chunks_exact(d.max(1)) {
        mean.iter_mut().zip(row).for_each(|(m, &v)| *m += v / n);
    }
    let mut var = vec![0.0; d];
    for row in x.chunks_exact(d.max(1)) {
        var.iter_mut()
            .zip(row.iter().zip(&mean))
            .for_each(|(s, (&v, &m))| *s += (v - m) * (v - m) / n);
    }
    let std = var
        .iter()
        .map(|&v| if v > 1e-24 { v.sqrt() } else { 1.0 })
        .collect();
    (mean, std)
}

/// Whether every value is an integer label in 0 … 255.
fn integer_labels(y: &[f64]) -> bool {
    y.iter()
        .all(|&v| v.fract() == 0.0 && (0.0..256.0).contains(&v))
}

/// The task `spec` asks for, checked against the targets.
fn task_of(spec: &TableSpec, train: &Table, test: &Table) -> Result<Task> {
    let all = || train.y.iter().chain(&test.y).copied();
    let max = all().fold(f64::NEG_INFINITY, f64::max);
    let classes_fit = integer_labels(&train.y) && integer_labels(&test.y);
    let kind = match spec.task {
        TaskKind::Auto if classes_fit && max < 100.0 => TaskKind::Classification,
        TaskKind::Auto => TaskKind::Regression,
        k => k,
    };
    match kind {
        TaskKind::Classification => {
            let origin = spec.csv.display();
            if !classes_fit {
                let bad = all().find(|&v| !integer_labels(&[v])).unwrap_or(f64::NAN);
                return Err(Error::Data(format!(
                    "{origin}: column `{}` holds {bad}, not a class label 0 … 255; use --task regression for a real value",
                    spec.target
                )));
            }
            let classes = max as usize + 1;
            if classes < 2 {
                return Err(Error::Data(format!(
                    "{origin}: column `{}` has one class only",
                    spec.target
                )));
            }
            Ok(Task::Classification { classes })
        }
        _ => {
            let (mean, std) = column_stats(&train.y, 1);
            Ok(Task::Regression {
                mean: mean[0],
                std: std[0],
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::table::parse_csv;

    fn spec(task: TaskKind) -> TableSpec {
        TableSpec {
            csv: "t.csv".into(),
            target: "y".into(),
            task,
            test_csv: None,
            test_fraction: 0.5,
            split_seed: 1,
            train_limit: None,
        }
    }

    #[test]
    fn features_and_targets_are_standardised_with_the_training_rows() {
        let train = parse_csv("a,c,y\n1,5,10\n3,5,20\n".as_bytes(), "t", "y").unwrap();
        let test = parse_csv("a,c,y\n5,5,40\n".as_bytes(), "t", "y").unwrap();
        let ds = build(&spec(TaskKind::Regression), train, test, None).unwrap();
        // Training targets 10 and 20: mean 15, std 5.
        assert_eq!(
            ds.task,
            Task::Regression {
                mean: 15.0,
                std: 5.0
            }
        );
        assert_eq!(ds.train.features, [-1.0, 0.0, 1.0, 0.0]);
        assert_eq!(ds.test.features, [3.0, 0.0]);
        assert_eq!(ds.train.values, [-1.0, 1.0]);
        assert_eq!(ds.test.values, [5.0]);
        assert!(ds.train.labels.is_empty() && ds.train.len() == 2 && ds.test.is_table());
    }

    #[test]
    fn integer_targets_are_classes_unless_told_otherwise() {
        let t = || parse_csv("a,y\n1,0\n2,2\n3,1\n".as_bytes(), "t", "y").unwrap();
        let ds = build(&spec(TaskKind::Auto), t(), t(), None).unwrap();
        assert_eq!(ds.task, Task::Classification { classes: 3 });
        assert_eq!(ds.train.labels, [0, 2, 1]);
        let ds = build(&spec(TaskKind::Regression), t(), t(), None).unwrap();
        assert!(ds.task.is_regression());
        let real = || parse_csv("a,y\n1,0.5\n2,1\n".as_bytes(), "t", "y").unwrap();
        let err = build(&spec(TaskKind::Classification), real(), real(), None).unwrap_err();
        assert!(err.to_string().contains("0.5, not a class label"), "{err}");
        let one = || parse_csv("a,y\n1,0\n2,0\n".as_bytes(), "t", "y").unwrap();
        assert!(build(&spec(TaskKind::Classification), one(), one(), None).is_err());
    }
}
