//! The endpoint contract (`ccl_core::transport::conformance`) over the in-process and TCP
//! transports.

use ccl_core::Config;
use ccl_core::transport::conformance::{self, Pair};
use ccl_core::transport::local::LocalTransport;
use ccl_core::transport::tcp::TcpTransport;

fn local() -> Pair {
    conformance::connect_pair(&LocalTransport::new(), &Config::default())
}

fn tcp() -> Pair {
    conformance::connect_pair(&TcpTransport::new(), &Config::default())
}

#[test]
fn local_meets_the_endpoint_contract() {
    conformance::run_all(&local);
}

#[test]
fn tcp_meets_the_endpoint_contract() {
    conformance::run_all(&tcp);
}
