//! The endpoint contract (`ccl_core::transport::conformance`) over shared memory, with the
//! default ring and with the smallest ring (so wrapping and back pressure happen often).

use ccl_core::Config;
use ccl_core::transport::conformance::{self, Pair};
use ccl_shm::ShmTransport;

fn shm() -> Pair {
    conformance::connect_pair(&ShmTransport::new(), &Config::default())
}

fn shm_small() -> Pair {
    let c = Config {
        shm_ring_size: 64 << 10,
        ..Config::default()
    };
    conformance::connect_pair(&ShmTransport::new(), &c)
}

#[test]
fn shm_meets_the_endpoint_contract() {
    conformance::run_all(&shm);
}

#[test]
fn shm_with_a_small_ring_meets_the_endpoint_contract() {
    conformance::run_all(&shm_small);
}
