use super::*;

#[test]
fn ecmp_is_deterministic_with_a_seed_and_qps_spread() {
    let mut f = Fabric {
        qps: 8,
        ..Fabric::default()
    };
    let n = Network::new(&f).unwrap();
    let a = n.footprint(0, 8 * 16 * 5);
    assert_eq!(a, Network::new(&f).unwrap().footprint(0, 8 * 16 * 5));
    assert_eq!(a.ports.len(), 8);
    let distinct: std::collections::BTreeSet<u16> = a.ports.iter().copied().collect();
    assert!(distinct.len() > 1, "{:?}", a.ports);
    // Shares on each tier add up to the whole connection.
    for t in [Tier::NicUp, Tier::RackUp, Tier::RackDown, Tier::NicDown] {
        let r = n.tier_links(t);
        let sum: f64 = a
            .links
            .iter()
            .filter(|l| r.contains(&(l.0 as usize)))
            .map(|l| l.1)
            .sum();
        assert!((sum - 1.0).abs() < 1e-12, "{t:?} {sum}");
    }
    // Another seed, other paths somewhere.
    f.seed = 2;
    let m = Network::new(&f).unwrap();
    let differs = (1..64).any(|h| n.footprint(0, 128 * h % 2048) != m.footprint(0, 128 * h % 2048));
    assert!(differs);
    // One port per connection: every QP on one path.
    f.ports = Ports::PerConn;
    let c = Network::new(&f).unwrap().footprint(0, 8 * 16 * 5);
    assert_eq!(c.links.len(), 4);
    assert!(c.links.iter().all(|l| (l.1 - 1.0).abs() < 1e-12));
}

#[test]
fn fabric_files_parse_and_name_bad_lines() {
    let f = Fabric::parse(
        "fab",
        "hosts-per-rack 4 # four\nspines 2\nrack-oversub 2\nhashing dqp\nslow-host 3 0.5\n",
    )
    .unwrap();
    assert_eq!(f.hosts_per_rack, 4);
    assert!((f.rack_oversubscription() - 2.0).abs() < 1e-9);
    assert_eq!(f.hashing, Hashing::DestQp);
    assert_eq!(Fabric::parse("x", &f.to_file()).unwrap(), f);
    for (text, want) in [
        ("spines 0\n", "spines must be at least 1"),
        ("nic-gbps fast\n", "line 1: 'fast' is not a number"),
        ("\nbogus 1\n", "line 2: unknown key 'bogus'"),
        ("hashing magic\n", "unknown hashing 'magic'"),
        ("slow-host 99999 0.5\n", "slow-host 99999"),
        ("qps\n", "expected 'qps VALUE'"),
    ] {
        let e = Fabric::parse("fab", text).unwrap_err();
        assert!(e.contains(want), "{e}");
        assert!(e.starts_with("fab"), "{e}");
    }
}
