//! Tables of your own, from CSV: a header row, then one row per example, every cell a
//! number; one column is the target, the others are the features. Read with the `csv`
//! crate, gzipped or plain (as the IDX files are), streaming: nothing is allocated from a
//! size the file declares. Every refusal is one line naming the file, the line and the
//! column.

use std::io::Read;
use std::path::Path;

use rand::seq::SliceRandom;
use rand::SeedableRng;

use crate::error::{Error, Result};

/// A table read from CSV.
#[derive(Debug, Clone, PartialEq)]
pub struct Table {
    /// The feature columns' names, in the file's order (the target's left out).
    pub features: Vec<String>,
    /// The target column's name.
    pub target: String,
    /// The features, row after row (`rows() × features.len()`).
    pub x: Vec<f64>,
    /// The target of each row.
    pub y: Vec<f64>,
}

impl Table {
    /// Examples in the table.
    pub fn rows(&self) -> usize {
        self.y.len()
    }

    /// The rows `rows` (in that order) as a table of their own.
    pub fn select(&self, rows: &[usize]) -> Table {
        let d = self.features.len();
        Table {
            features: self.features.clone(),
            target: self.target.clone(),
            x: rows
                .iter()
                .flat_map(|&r| self.x[r * d..(r + 1) * d].iter().copied())
                .collect(),
            y: rows.iter().map(|&r| self.y[r]).collect(),
        }
    }

    /// A seeded split into training and test rows: `test_fraction` of the rows (rounded,
    /// at least one of each) drawn by a shuffle seeded with `seed`, each part in file
    /// order. Returns the test rows' indices beside the two tables, so that a run can
    /// record them.
    pub fn split(&self, test_fraction: f64, seed: u64) -> Result<(Table, Table, Vec<usize>)> {
        let n = self.rows();
        if !(test_fraction > 0.0 && test_fraction < 1.0) {
            return Err(Error::Config(format!(
                "--test-fraction must be in (0, 1), got {test_fraction}"
            )));
        }
        let n_test = ((n as f64 * test_fraction).round() as usize).clamp(1, n.max(2) - 1);
        if n < 2 {
            return Err(Error::Data(format!(
                "a table of {n} row(s) cannot be split into training and test rows"
            )));
        }
        let mut order: Vec<usize> = (0..n).collect();
        order.shuffle(&mut rand::rngs::StdRng::seed_from_u64(seed));
        let mut test: Vec<usize> = order[..n_test].to_vec();
        let mut train: Vec<usize> = order[n_test..].to_vec();
        test.sort_unstable();
        train.sort_unstable();
        Ok((self.select(&train), self.select(&test), test))
    }
}

/// Reads the CSV file at `path` (gzipped or plain) with `target` as the target column.
pub fn read_csv(path: &Path, target: &str) -> Result<Table> {
    let reader = super::idx::open_maybe_gzipped(path)?;
    parse_csv(reader, &path.display().to_string(), target)
}

/// Parses CSV text from `reader` (`origin` names it in errors) with `target` as the
/// target column.
pub fn parse_csv(reader: impl Read, origin: &str, target: &str) -> Result<Table> {
    let bad = |m: String| Error::Data(format!("{origin}: {m}"));
    let mut csv = csv::ReaderBuilder::new()
        .has_headers(true)
        // Rows of another length are reported below, with their line.
        .flexible(true)
        .from_reader(reader);
    let header: Vec<String> = csv
        .headers()
        .map_err(|e| bad(csv_error(&e)))?
        .iter()
        .map(|h| h.trim().to_string())
        .collect();
    if header.iter().all(|h| h.is_empty()) {
        return Err(bad("empty: no header row".into()));
    }
    check_header(&header).map_err(bad)?;
    let t = header.iter().position(|h| h == target).ok_or_else(|| {
        bad(format!(
            "no column `{target}` to predict (the columns: {})",
            header.join(", ")
        ))
    })?;
    let (mut x, mut y) = (Vec::new(), Vec::new());
    let mut record = csv::StringRecord::new();
    loop {
        match csv.read_record(&mut record) {
            Ok(true) => {}
            Ok(false) => break,
            Err(e) => return Err(bad(csv_error(&e))),
        }
        let line = record.position().map_or(0, |p| p.line());
        if record.len() != header.len() {
            return Err(bad(format!(
                "line {line} has {} cells, the header {}",
                record.len(),
                header.len()
            )));
        }
        for (c, cell) in record.iter().enumerate() {
            let v = number(cell).map_err(|why| {
                bad(format!(
                    "line {line}, column {} (`{}`): {why}",
                    c + 1,
                    header[c]
                ))
            })?;
            if c == t {
                y.push(v);
            } else {
                x.push(v);
            }
        }
    }
    if y.is_empty() {
        return Err(bad("a header but no rows".into()));
    }
    let mut features = header;
    let target = features.remove(t);
    Ok(Table {
        features,
        target,
        x,
        y,
    })
}

/// Column names: none empty, none twice.
fn check_header(header: &[String]) -> std::result::Result<(), String> {
    for (i, h) in header.iter().enumerate() {
        if h.is_empty() {
            return Err(format!("line 1: column {} has no name", i + 1));
        }
        if header[..i].contains(h) {
            return Err(format!("line 1: column `{h}` appears twice"));
        }
    }
    Ok(())
}

/// A cell's value: a finite number, or why not.
fn number(cell: &str) -> std::result::Result<f64, String> {
    let cell = cell.trim();
    if cell.is_empty() {
        return Err("empty (a missing value)".into());
    }
    match cell.parse::<f64>() {
        Ok(v) if v.is_finite() => Ok(v),
        Ok(_) => Err(format!("`{cell}` is not a finite number")),
        Err(_) => Err(format!("`{cell}` is not a number")),
    }
}

/// The csv crate's error in one line, with its line where it has one; an I/O error while
/// reading (such as a damaged gzip stream) says so.
fn csv_error(e: &csv::Error) -> String {
    let line = e.position().map(|p| format!("line {}: ", p.line()));
    match e.kind() {
        csv::ErrorKind::Io(io) => format!("cannot read ({io})"),
        csv::ErrorKind::Utf8 { .. } => format!("{}not UTF-8 text", line.unwrap_or_default()),
        _ => format!("{}{e}", line.unwrap_or_default()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Table> {
        parse_csv(text.as_bytes(), "t.csv", "y")
    }

    #[test]
    fn a_table_is_read_with_its_target_apart() {
        let t = parse("a,y,b\n1,10,2\n3,20,4.5\n").unwrap();
        assert_eq!(t.features, ["a", "b"]);
        assert_eq!(t.target, "y");
        assert_eq!(t.x, [1.0, 2.0, 3.0, 4.5]);
        assert_eq!(t.y, [10.0, 20.0]);
    }

    /// Each hostile input gets one line naming the file, and the line and column where
    /// there is one.
    #[test]
    fn bad_tables_are_one_line_errors() {
        let cases = [
            ("", "t.csv: empty: no header row"),
            ("a,y\n", "t.csv: a header but no rows"),
            (
                "a,b\n1,2\n",
                "t.csv: no column `y` to predict (the columns: a, b)",
            ),
            (
                "a,y\n1,2\nx,3\n",
                "t.csv: line 3, column 1 (`a`): `x` is not a number",
            ),
            ("a,y\n1,2\n3\n", "t.csv: line 3 has 1 cells, the header 2"),
            (
                "a,y\n1,\n",
                "t.csv: line 2, column 2 (`y`): empty (a missing value)",
            ),
            (
                "a,y\nNaN,1\n",
                "t.csv: line 2, column 1 (`a`): `NaN` is not a finite number",
            ),
            (
                "a,y\n1e999,1\n",
                "t.csv: line 2, column 1 (`a`): `1e999` is not a finite number",
            ),
            ("a,a,y\n1,2,3\n", "t.csv: line 1: column `a` appears twice"),
        ];
        for (text, want) in cases {
            let got = parse(text).unwrap_err().to_string();
            assert!(got.contains(want), "{text:?}: {got}");
            assert!(!got.contains('\n'), "{text:?}: more than one line: {got}");
        }
    }

    #[test]
    fn a_seeded_split_is_a_partition_and_repeats() {
        let text: String = std::iter::once("a,y\n".to_string())
            .chain((0..100).map(|i| format!("{i},{}\n", 2 * i)))
            .collect();
        let t = parse(&text).unwrap();
        let (train, test, rows) = t.split(0.2, 5).unwrap();
        assert_eq!((train.rows(), test.rows()), (80, 20));
        let mut all: Vec<f64> = train.x.iter().chain(&test.x).copied().collect();
        all.sort_by(f64::total_cmp);
        assert_eq!(all, (0..100).map(|i| i as f64).collect::<Vec<_>>());
        assert_eq!(test.x, rows.iter().map(|&r| r as f64).collect::<Vec<_>>());
        assert_eq!(t.split(0.2, 5).unwrap().2, rows);
        assert_ne!(t.split(0.2, 6).unwrap().2, rows);
    }
}
