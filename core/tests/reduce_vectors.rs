//! The shared reduction vectors (`reduce_vectors.json`, beside this file)
//! hold for the host's reduction and chunking. Every guest SDK's test host
//! checks its own reduction against the same file (the Python SDK's in
//! `guest-sdk-python/tests/test_reduce.py`), so a handler's unit tests see
//! the runs the host would hand it.

use wakuwaku_core::event::Algebra;
use wakuwaku_core::reduce::{chunks, reduce};

#[derive(serde::Deserialize)]
struct Vectors {
    reduce: Vec<ReduceCase>,
    chunks: Vec<ChunkCase>,
}

#[derive(serde::Deserialize)]
struct ReduceCase {
    algebra: String,
    run: Vec<String>,
    reduced: Vec<String>,
}

#[derive(serde::Deserialize)]
struct ChunkCase {
    events: usize,
    max_batch: u32,
    sizes: Vec<usize>,
}

fn vectors() -> Vectors {
    serde_json::from_str(include_str!("reduce_vectors.json")).expect("reduce_vectors.json parses")
}

fn bytes(bodies: &[String]) -> Vec<Vec<u8>> {
    bodies.iter().map(|body| body.as_bytes().to_vec()).collect()
}

/// The vectors' stand-in `combine`: the bodies joined with `+`.
fn join(bodies: &[Vec<u8>]) -> Result<Vec<u8>, String> {
    Ok(bodies.join(&b'+'))
}

#[test]
fn every_algebra_reduces_runs_as_the_vectors_say() {
    let cases = vectors().reduce;
    for algebra in Algebra::ALL {
        assert!(cases.iter().any(|case| case.algebra == algebra.name()), "no vector for {}", algebra.name());
    }
    for ReduceCase { algebra: name, run, reduced } in cases {
        let algebra = Algebra::ALL
            .into_iter()
            .find(|algebra| algebra.name() == name)
            .unwrap_or_else(|| panic!("unknown algebra `{name}`"));
        let mut combines = 0;
        let result = reduce(algebra, bytes(&run), |bodies| {
            combines += 1;
            join(bodies)
        });
        assert_eq!(result, Ok(bytes(&reduced)), "{name} {run:?}");
        let folds = algebra == Algebra::Associative && run.len() >= 2;
        assert_eq!(combines, usize::from(folds), "{name} {run:?}: combine is called once, for a run of two or more");
    }
}

#[test]
fn reduced_runs_are_cut_into_calls_as_the_vectors_say() {
    for ChunkCase { events, max_batch, sizes } in vectors().chunks {
        let bodies = vec![Vec::new(); events];
        let got: Vec<usize> = chunks(&bodies, max_batch).map(<[_]>::len).collect();
        assert_eq!(got, sizes, "{events} events, max batch {max_batch}");
    }
}
