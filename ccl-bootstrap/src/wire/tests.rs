use super::*;

#[test]
fn monitor_tree_frames_round_trip() {
    let inner = Frame::new(FrameKind::StateReply, vec![1, 2, 3]);
    for kind in [FrameKind::Up, FrameKind::Down] {
        let e = envelope(kind, 77, &inner);
        assert_eq!(e.kind, kind);
        assert_eq!(open_envelope(&e.payload).unwrap(), (77, inner.clone()));
        // Cut anywhere, or with bytes after it, it is an error, never a panic.
        for cut in 0..e.payload.len() {
            assert!(open_envelope(&e.payload[..cut]).is_err());
        }
        let mut long = e.payload.clone();
        long.push(0);
        assert!(open_envelope(&long).is_err());
    }
    let w = Watchme {
        pid: 42,
        fanout: 64,
        listen: Some("10.0.0.9:1234".parse().unwrap()),
        host: "node-3".into(),
    };
    let f = w.encode();
    assert_eq!(Watchme::decode(&f.payload).unwrap(), w);
    let leaf = Watchme { listen: None, ..w };
    assert_eq!(Watchme::decode(&leaf.encode().payload).unwrap(), leaf);
    for cut in 0..9 {
        assert!(Watchme::decode(&f.payload[..cut]).is_err());
    }
    let a = attach(5, "[::1]:99".parse().unwrap());
    assert_eq!(
        read_attach(&a.payload),
        Some((5, "[::1]:99".parse().unwrap()))
    );
    assert_eq!(read_attach(&a.payload[..3]), None);
    let j = join(&[3; 32], 9);
    assert_eq!(read_join(&j), Some(([3; 32], 9)));
    assert_eq!(read_join(&Frame::new(FrameKind::Join, vec![0; 35])), None);
    let q = digest_query(7, std::time::Duration::from_millis(900));
    assert_eq!(
        read_digest_query(&q.payload),
        Some((7, std::time::Duration::from_millis(900)))
    );
    assert_eq!(read_digest_query(&q.payload[..7]), None);
    let view = ccl_diag::verdict::RankView::absent(4, "h", 1, ccl_diag::verdict::Presence::Dead);
    let d = ccl_diag::digest::Digest::of(&[view]);
    let r = digest_reply(7, &d);
    assert_eq!(read_digest_reply(&r.payload), Ok((7, d)));
    for cut in 0..r.payload.len() {
        assert!(
            read_digest_reply(&r.payload[..cut]).is_err(),
            "cut at {cut}"
        );
    }
}

#[test]
fn failover_frames_round_trip() {
    let s = Standby {
        ranks: vec![
            (1, "10.0.0.2:4000".parse().unwrap()),
            (5, "[::1]:7".parse().unwrap()),
        ],
        with_root: vec![0, 2],
        left: vec![2],
    };
    let f = s.encode();
    assert_eq!(Standby::decode(&f.payload, 6).unwrap(), s);
    // A rank beyond the job, a cut or a trailing byte is an error, never a panic.
    assert!(Standby::decode(&f.payload, 5).is_err());
    for cut in 0..f.payload.len() {
        assert!(
            Standby::decode(&f.payload[..cut], 6).is_err(),
            "cut at {cut}"
        );
    }
    let mut long = f.payload.clone();
    long.push(0);
    assert!(Standby::decode(&long, 6).is_err());
    let j = Rejoin {
        secret: [7; 32],
        rank: 3,
        pid: 99,
        dead: vec![0, 4],
        round: None,
        host: "node-1".into(),
    };
    let f = j.encode();
    assert_eq!(Rejoin::decode(&f), Some(j.clone()));
    let k = Rejoin {
        round: Some(Outcome {
            id: vec![9; 128],
            members: vec![1, 3, 5],
            committed: true,
        }),
        ..j
    };
    let g = k.encode();
    assert_eq!(Rejoin::decode(&g), Some(k));
    // Cut anywhere before the host name, it is no frame.
    for cut in 0..g.payload.len() - "node-1".len() {
        let h = Frame::new(FrameKind::Rejoin, g.payload[..cut].to_vec());
        assert_eq!(Rejoin::decode(&h), None, "cut at {cut}");
    }
    for cut in 0..44 {
        let g = Frame::new(FrameKind::Rejoin, f.payload[..cut].to_vec());
        assert_eq!(Rejoin::decode(&g), None, "cut at {cut}");
    }
    assert_eq!(
        Rejoin::decode(&Frame::new(FrameKind::Join, f.payload)),
        None
    );
}

#[test]
fn blobs_round_trip() {
    let b = vec![vec![], vec![1, 2, 3], vec![9; 1000]];
    assert_eq!(decode_blobs(&encode_blobs(&b)).unwrap(), b);
}

#[test]
fn hello_round_trip() {
    let h = Hello {
        secret: [5; 32],
        rank: 3,
        size: 8,
        listen: Some("10.1.2.3:4567".parse().unwrap()),
    };
    assert_eq!(Hello::decode(&h.encode()).unwrap(), h);
    let alone = Hello {
        listen: None,
        ..h.clone()
    };
    assert_eq!(Hello::decode(&alone.encode()).unwrap(), alone);
    let mut f = h.encode();
    f.payload[0] = b'X';
    assert!(Hello::decode(&f).is_err());
    f.payload.truncate(10);
    assert!(Hello::decode(&f).is_err());
}

#[test]
fn gather_frames_round_trip() {
    let a = GatherAsk {
        secret: [7; 32],
        rank: 1000,
        round: 2,
        step: 9,
    };
    assert_eq!(GatherAsk::decode(&a.encode()).unwrap(), a);
    let mut f = a.encode();
    f.payload[3] ^= 1;
    assert!(GatherAsk::decode(&f).is_err());
    for next in [None, Some("[fe80::1]:9".parse().unwrap())] {
        let b = Block {
            next,
            records: vec![vec![1, 2], vec![]],
        };
        assert_eq!(Block::decode(&b.encode().payload).unwrap(), b);
    }
    assert!(Block::decode(&[]).is_err());
    assert!(Block::decode(&[7, 4, 0]).is_err());
}

#[test]
fn notices_round_trip_and_frames_split() {
    let n = Notice {
        rank: 7,
        died: true,
        message: "gone".into(),
        verdict: "allreduce #3 is stuck behind rank 7".into(),
        culprit: Some(7),
    };
    let f = n.encode(FrameKind::Notice);
    assert_eq!(Notice::decode(&f.payload).unwrap(), n);
    let long = Notice {
        rank: 1,
        died: false,
        message: "é".repeat(3000),
        verdict: String::new(),
        culprit: None,
    };
    let d = Notice::decode(&long.encode(FrameKind::Failure).payload).unwrap();
    assert!(d.message.len() <= MAX_NOTICE && d.message.chars().all(|c| c == 'é'));
    // Two frames and half of a third arrive together.
    let mut buf = f.encode();
    buf.extend(Frame::new(FrameKind::Bye, vec![]).encode());
    let third = f.encode();
    buf.extend_from_slice(&third[..4]);
    let got = take_frames(&mut buf).unwrap();
    assert_eq!(got.len(), 2);
    assert_eq!(buf.len(), 4);
    buf.extend_from_slice(&third[4..]);
    assert_eq!(take_frames(&mut buf).unwrap(), vec![f]);
    assert!(buf.is_empty());
    assert!(Notice::decode(&[1, 0, 0, 0, 9]).is_err());
}

#[test]
fn headers_are_bounded() {
    assert!(decode_header(&[0xff, 0xff, 0xff, 0xff, 4]).is_err());
    assert!(decode_header(&[1, 0, 0, 0, 99]).is_err());
    assert_eq!(
        decode_header(&[3, 0, 0, 0, 4]).unwrap(),
        (3, FrameKind::Gather)
    );
}

/// A deterministic generator of hostile inputs: every decoder returns an error or a value,
/// never panics, and never allocates beyond the input size.
#[test]
fn decoders_survive_garbage() {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let good = encode_blobs(&[vec![1; 10], vec![2; 3]]);
    for _ in 0..20_000 {
        let len = (next() % 64) as usize;
        let mut v: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        let _ = decode_blobs(&v);
        let _ = Hello::decode(&Frame::new(FrameKind::Hello, v.clone()));
        let _ = GatherAsk::decode(&Frame::new(FrameKind::Gather, v.clone()));
        let _ = Block::decode(&v);
        if v.len() >= 5 {
            let _ = decode_header(&v[..5].try_into().unwrap());
        }
        // Mutations of a valid message.
        v = good.clone();
        let i = (next() as usize) % v.len();
        v[i] = next() as u8;
        let _ = decode_blobs(&v);
        let cut = (next() as usize) % v.len();
        let _ = decode_blobs(&v[..cut]);
        let _ = Notice::decode(&v);
        let mut acc = v.clone();
        let _ = take_frames(&mut acc);
    }
}
