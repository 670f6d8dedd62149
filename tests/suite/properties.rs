//! Property tests of the readers of files a user or a stranger hands the tool: the IDX
//! reader, the sample and state reader, the preset parser. Arbitrary bytes and mutations
//! of valid files must give a value or an error, never a panic, an abort or an allocation
//! the input did not pay for. `PROPTEST_CASES` sets the cases per property (default 256
//! here, a few seconds in all; `PROPTEST_CASES=100000` for the long run) from a fixed seed
//! (`PROPTEST_RNG_SEED` another).

use std::collections::BTreeMap;

use proptest::prelude::*;

use bnn::checkpoint::{encode_safetensors, open_safetensors};
use bnn::data::idx;
use bnn::settings::Preset;

fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256);
    // A fixed seed (PROPTEST_RNG_SEED another): the same cases on every run.
    let seed = std::env::var("PROPTEST_RNG_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    ProptestConfig {
        cases,
        failure_persistence: None,
        rng_seed: proptest::test_runner::RngSeed::Fixed(seed),
        ..ProptestConfig::default()
    }
}

/// A small valid IDX images file, raw and gzipped.
fn idx_file(gzip: bool) -> Vec<u8> {
    let raw = idx::encode(&[3, 4, 5], &(0..60).map(|i| i as u8).collect::<Vec<_>>());
    if !gzip {
        return raw;
    }
    use std::io::Write;
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(&raw).unwrap();
    enc.finish().unwrap()
}

/// A small valid sample file: two tensors and metadata.
fn sample_file() -> Vec<u8> {
    let dev = candle_core::Device::Cpu;
    let w = candle_core::Tensor::arange(0f32, 12.0, &dev)
        .unwrap()
        .reshape((3, 4))
        .unwrap();
    let b = candle_core::Tensor::new(&[0.5f32, -1.0, 2.0], &dev).unwrap();
    let meta = BTreeMap::from([("step".to_string(), "40".to_string())]);
    encode_safetensors(&[("fc1.weight".into(), w), ("fc1.bias".into(), b)], &meta).unwrap()
}

/// A small valid run state (two parameter tensors, momenta, ensembles of 3 examples),
/// as the bytes of its file.
fn state_file() -> Vec<u8> {
    use bnn::ensemble::{AccumulatorState, Sums};
    let dev = candle_core::Device::Cpu;
    let t = |v: &[f32]| candle_core::Tensor::new(v, &dev).unwrap();
    let acc = || {
        let state = AccumulatorState {
            samples: 1,
            history: Vec::new(),
            last_sample: None,
            sample_nll: vec![0.5],
        };
        let sums = Sums {
            probability: vec![0.1; 30],
            entropy: vec![0.2; 3],
        };
        (state, sums)
    };
    let state = bnn::run_state::RunState {
        progress: Default::default(),
        params: vec![("w".into(), t(&[1.0, 2.0, 3.0])), ("b".into(), t(&[0.5]))],
        sampler: bnn::sampler::SamplerState::Sgnht(bnn::sampler::SgnhtState {
            clock: bnn::sampler::Clock {
                step: 7,
                step_size: 1e-3,
            },
            momentum: vec![t(&[0.1, 0.2, 0.3]), t(&[0.0])],
            thermostat: 0.01,
            kinetic: 0.5,
        }),
        prior_precisions: vec![1.0, 1.0],
        test: acc(),
        valid: None,
        kinetic_trace: vec![0.5],
        rollbacks: 0,
        regression: None,
        noise_precision: None,
        configurational: Default::default(),
        step_halvings: 0,
    };
    let dir = tempfile::tempdir().unwrap();
    state.save(dir.path()).unwrap();
    std::fs::read(bnn::run_state::state_path(dir.path())).unwrap()
}

/// One of `values`, as an owned string.
fn select(values: &[&'static str]) -> impl Strategy<Value = String> {
    proptest::sample::select(values.to_vec()).prop_map(str::to_string)
}

/// Byte edits of a valid file: (position, new byte) overwrites, then a cut.
fn mutate(mut bytes: Vec<u8>, edits: &[(usize, u8)], cut: Option<usize>) -> Vec<u8> {
    for &(at, v) in edits {
        if !bytes.is_empty() {
            let at = at % bytes.len();
            bytes[at] = v;
        }
    }
    if let Some(c) = cut {
        bytes.truncate(c % (bytes.len() + 1));
    }
    bytes
}

thread_local! {
    static STATE: Vec<u8> = state_file();
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn idx_reader_takes_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        if let Ok(a) = idx::from_bytes(&bytes, "x") {
            prop_assert_eq!(a.data.len(), a.dims.iter().product::<usize>());
        }
    }

    #[test]
    fn idx_reader_takes_mutated_files(
        gzip in any::<bool>(),
        edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..6),
        cut in proptest::option::of(any::<usize>()),
    ) {
        let bytes = mutate(idx_file(gzip), &edits, cut);
        if let Ok(a) = idx::from_bytes(&bytes, "x") {
            prop_assert_eq!(a.data.len(), a.dims.iter().product::<usize>());
            prop_assert!(a.data.len() <= idx::MAX_DATA_BYTES);
        }
    }

    #[test]
    fn sample_reader_takes_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        let _ = open_safetensors(&bytes);
    }

    /// A mutated sample is refused unless its tensors (names, shapes, data) are as they
    /// were: edits to the header's padding or to the metadata's other values can be
    /// harmless. One way past: an edit that undoes the checksum's key, since a file
    /// without one is read as written before checksums were recorded.
    #[test]
    fn sample_reader_takes_mutated_files(
        edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..4),
        cut in proptest::option::of(any::<usize>()),
    ) {
        let valid = sample_file();
        let original = open_safetensors(&valid).unwrap();
        let bytes = mutate(valid.clone(), &edits, cut);
        if let Ok(checked) = open_safetensors(&bytes) {
            let views = checked.tensors.tensors();
            let same = views.len() == original.tensors.len()
                && views.iter().all(|(name, view)| {
                    original
                        .tensors
                        .tensor(name)
                        .is_ok_and(|o| o.data() == view.data() && o.shape() == view.shape())
                });
            let unchecked = !checked.metadata.contains_key(bnn::checkpoint::CHECKSUM_KEY);
            prop_assert!(same || unchecked, "changed tensors read as valid");
        }
    }

    /// A mutated state file loads only with its parameters as they were (or, as for
    /// samples, without the checksum's key); else one error, never a panic.
    #[test]
    fn state_reader_takes_mutated_files(
        edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..4),
        cut in proptest::option::of(any::<usize>()),
    ) {
        let bytes = mutate(STATE.with(|s| s.clone()), &edits, cut);
        let dir = tempfile::tempdir().unwrap();
        let path = bnn::run_state::state_path(dir.path());
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &bytes).unwrap();
        let names = ["w".to_string(), "b".to_string()];
        if let Ok(state) = bnn::run_state::RunState::load(dir.path(), &names) {
            let values: Vec<Vec<f32>> = state
                .params
                .iter()
                .map(|(_, t)| t.to_vec1::<f32>().unwrap())
                .collect();
            let unchecked = open_safetensors(&bytes)
                .is_ok_and(|c| !c.metadata.contains_key(bnn::checkpoint::CHECKSUM_KEY));
            prop_assert!(
                values == [vec![1.0, 2.0, 3.0], vec![0.5]] || unchecked,
                "changed parameters read as valid: {values:?}"
            );
        }
    }

    #[test]
    fn preset_parser_takes_arbitrary_text(text in "\\PC{0,300}") {
        let _ = Preset::from_toml_str(&text, "p.toml");
    }

    /// Presets built from the keys a preset has, with values of any type and size (string
    /// strategies are regular expressions in proptest, so the values are picked from lists).
    #[test]
    fn preset_parser_takes_odd_values(
        kind in select(&["\"mlp\"", "\"cnn\"", "\"resnet\"", "3", "\"x\""]),
        hidden in select(&["[100]", "[]", "[0]", "[-1]", "[70000, 2]", "\"wide\"", "[1e9]"]),
        conv in select(&["[6, 16]", "[]", "[0]", "[100000]", "[1, 2, 3, 4, 5, 6]"]),
        kernel in select(&["5", "0", "-2", "40", "2.5", "99999999999"]),
        padding in select(&["0", "2", "5", "-1", "18446744073709551615"]),
        steps in select(&["1e-6", "0", "-1", "nan", "inf", "\"x\""]),
        batch in select(&["100", "0", "-5", "1e3"]),
        extra in select(&["", "bogus = 1\n", "[other]\n"]),
    ) {
        let text = format!(
            "[model]\nkind = {kind}\nhidden = {hidden}\nactivation = \"relu\"\nconv = {conv}\n\
             kernel_size = {kernel}\npadding = {padding}\n{extra}[train]\nstep_size = {steps}\n\
             batch_size = {batch}\n"
        );
        if let Ok(p) = Preset::from_toml_str(&text, "p.toml") {
            // What is accepted builds a network on 28×28 images or says why not.
            let _ = bnn::model::Network::new(&p.model, 784, 10, 0, &candle_core::Device::Cpu);
        }
    }
}
