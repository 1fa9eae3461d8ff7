//! Network planes in the model: a connection striped over both NICs of its hosts, each plane's
//! share by its rate, as the TCP transport's planes do (`scripts/two-planes.sh` measures the
//! same cases on real network stacks; docs/fault-tolerance.md compares the two).

use ccl_sim::{Fabric, Source, simulate};

/// Two hosts of one rank, two planes of 0.8 Gbit/s: the setting of `scripts/two-planes.sh`.
fn two_planes() -> Fabric {
    Fabric {
        ranks_per_host: 1,
        hosts_per_rack: 2,
        racks_per_zone: 1,
        nics_per_host: 2,
        nic_gbps: 0.8,
        stripe_nics: true,
        ..Fabric::default()
    }
}

fn time_us(f: &Fabric) -> f64 {
    simulate(f, "ring", 64 << 20, Source::Built)
        .expect("simulate")
        .time_us
}

#[test]
fn planes_share_by_rate_and_a_plane_down_leaves_the_other() {
    let two = time_us(&two_planes());
    let one = time_us(&Fabric {
        nics_per_host: 1,
        stripe_nics: false,
        ..two_planes()
    });
    let down = time_us(&Fabric {
        slow_nics: vec![(0, 1, 0.0), (1, 1, 0.0)],
        ..two_planes()
    });
    let half = time_us(&Fabric {
        slow_nics: vec![(0, 1, 0.5), (1, 1, 0.5)],
        ..two_planes()
    });
    // The links are the limit: two planes take half the time of one; a plane down leaves one;
    // a plane at half rate leaves 1.5 planes' worth (a 50/50 stripe would take 2x).
    assert!((one / two - 2.0).abs() < 0.1, "one {one} two {two}");
    assert!((down / one - 1.0).abs() < 0.05, "down {down} one {one}");
    assert!(
        (half / two - 4.0 / 3.0).abs() < 0.07,
        "half {half} two {two}"
    );
}

#[test]
fn a_plane_down_needs_striping_and_files_round_trip() {
    let f = Fabric {
        slow_nics: vec![(1, 0, 0.0)],
        ..two_planes()
    };
    assert_eq!(Fabric::parse("t", &f.to_file()).expect("parse"), f);
    let unstriped = Fabric {
        stripe_nics: false,
        ..f
    };
    let e = unstriped.check().expect_err("a NIC at 0 without striping");
    assert!(e.contains("slow-nic 1 0"), "{e}");
}
