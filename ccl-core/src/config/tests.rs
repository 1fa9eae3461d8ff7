use super::*;
use crate::error::ErrorKind;
use std::collections::HashMap;

fn cfg(vars: &[(&str, &str)]) -> Result<Config> {
    let m: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Config::from_lookup(|k| m.get(k).cloned())
}

#[test]
fn defaults() {
    let c = Config::default();
    assert_eq!(c.log_level, LogLevel::Warn);
    assert_eq!(c.timeout, Duration::from_secs(600));
    assert_eq!(c.transport, TransportKind::Auto);
    assert_eq!(c.chunk_size, 128 << 10);
    assert!(c.rank.is_none() && c.socket_ifname.is_none());
}

#[test]
fn values_parse() {
    let c = cfg(&[
        ("CCL_TIMEOUT", "2.5"),
        ("CCL_DEBUG", "INFO"),
        ("CCL_TRANSPORT", "tcp"),
        ("CCL_CHUNK_SIZE", "1M"),
        ("CCL_RANK", "3"),
        ("CCL_SOCKET_IFNAME", "=lo"),
    ])
    .unwrap();
    assert_eq!(c.timeout, Duration::from_millis(2500));
    assert_eq!(c.log_level, LogLevel::Info);
    assert_eq!(c.transport, TransportKind::Tcp);
    assert_eq!(c.chunk_size, 1 << 20);
    assert_eq!(c.rank, Some(3));
    assert_eq!(c.socket_ifname.as_deref(), Some("=lo"));
}

#[test]
fn bad_values_name_the_variable() {
    for (k, v) in [
        ("CCL_TIMEOUT", "soon"),
        ("CCL_TIMEOUT", "-1"),
        ("CCL_TIMEOUT", "inf"),
        ("CCL_DEBUG", "loud"),
        ("CCL_TRANSPORT", "carrier-pigeon"),
        ("CCL_CONNECT", "whenever"),
        ("CCL_MONITOR_FANOUT", "1"),
        ("CCL_CHUNK_SIZE", "0"),
        ("CCL_CHUNK_SIZE", "12Q"),
        ("CCL_CHUNK_SIZE", "99999999999999999999G"),
        ("CCL_RANK", "abc"),
        ("CCL_WORLD_SIZE", "-2"),
        ("CCL_BOOTSTRAP_PORT", "70000"),
        ("CCL_IB_TIMEOUT", "0"),
        ("CCL_IB_TIMEOUT", "32"),
        ("CCL_IB_RETRY_CNT", "8"),
        ("CCL_IB_TC", "256"),
        ("CCL_IB_CTRL_TC", "x"),
        ("CCL_IB_QPS_PER_CONN", "0"),
        ("CCL_IB_SPLIT_DATA_ON_QPS", "2"),
        ("CCL_IB_SLOTS", "1"),
        ("CCL_IB_SLOTS", "257"),
        ("CCL_IB_SLOT_SIZE", "1K"),
        ("CCL_IB_SLOT_SIZE", "9M"),
        ("CCL_IB_GID_INDEX", "-1"),
        ("CCL_IB_SPIN_US", "ms"),
        ("CCL_TRACE_CLOCK", "sundial"),
    ] {
        let e = cfg(&[(k, v)]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{k}={v}");
        assert!(e.to_string().contains(k), "{e}");
        assert!(e.to_string().contains(v), "{e}");
    }
}

#[test]
fn ib_settings() {
    let d = Config::default().ib;
    assert_eq!((d.timeout, d.retry_cnt, d.rnr_retry), (20, 7, 7));
    assert_eq!((d.tc, d.ctrl_tc, d.qps_per_conn), (0, 0, 1));
    assert_eq!((d.slots, d.slot_size), (16, 256 << 10));
    assert!(!d.split_data_on_qps);
    assert!(d.hca.is_none() && d.gid_index.is_none());
    let c = cfg(&[
        ("CCL_IB_HCA", "^mlx5_1,=rxe0:1"),
        ("CCL_IB_GID_INDEX", "3"),
        ("CCL_IB_TC", "106"),
        ("CCL_IB_CTRL_TC", "224"),
        ("CCL_IB_QPS_PER_CONN", "4"),
        ("CCL_IB_SPLIT_DATA_ON_QPS", "1"),
        ("CCL_IB_SLOTS", "8"),
        ("CCL_IB_SLOT_SIZE", "1M"),
    ])
    .unwrap()
    .ib;
    assert_eq!(c.hca.as_deref(), Some("^mlx5_1,=rxe0:1"));
    assert_eq!(c.gid_index, Some(3));
    assert_eq!((c.tc, c.ctrl_tc, c.qps_per_conn), (106, 224, 4));
    assert!(c.split_data_on_qps);
    assert_eq!((c.slots, c.slot_size), (8, 1 << 20));
}

#[test]
fn sizes() {
    assert_eq!(parse_size("X", "4096", 0).unwrap(), 4096);
    assert_eq!(parse_size("X", "128K", 0).unwrap(), 128 << 10);
    assert_eq!(parse_size("X", "2g", 0).unwrap(), 2 << 30);
    assert!(parse_size("X", "", 0).is_err());
    assert!(parse_size("X", "K", 0).is_err());
}

#[test]
fn the_automatic_ring_is_three_quarters_of_the_l2_within_bounds() {
    assert_eq!(auto_ring_size(Some(1 << 20)), 768 << 10);
    assert_eq!(auto_ring_size(Some(256 << 10)), 192 << 10);
    assert_eq!(auto_ring_size(Some(1280 << 10)), 960 << 10);
    // Whole pages; never past 1M nor under 64K.
    assert_eq!(auto_ring_size(Some(1_000_000)), 749_568);
    assert_eq!(auto_ring_size(Some(2 << 20)), 1 << 20);
    assert_eq!(auto_ring_size(Some(64 << 10)), 64 << 10);
    assert_eq!(auto_ring_size(None), 512 << 10);
    let auto = cfg(&[("CCL_SHM_RING_SIZE", "auto")]).unwrap().shm_ring_size;
    assert_eq!(Config::default().shm_ring_size, auto);
    assert!(auto % 4096 == 0 && (64 << 10..=1 << 20).contains(&auto));
    let set = cfg(&[("CCL_SHM_RING_SIZE", "2M")]).unwrap().shm_ring_size;
    assert_eq!(set, 2 << 20);
    let e = cfg(&[("CCL_SHM_RING_SIZE", "automatic")]).unwrap_err();
    assert!(e.to_string().contains("CCL_SHM_RING_SIZE"), "{e}");
}

#[test]
fn every_setting_is_documented() {
    let doc = include_str!("../../../docs/env.md");
    for s in SETTINGS {
        assert!(
            doc.contains(&format!("`{}`", s.name)),
            "docs/env.md does not document {}",
            s.name
        );
    }
}
