//! `include/ccl.h` and the library agree: every prototype in the header matches the Rust
//! export's signature type for type, every enum constant and macro matches its Rust value, and
//! the shared library exports exactly the header's functions.

mod common;

use std::collections::BTreeMap;
use std::process::Command;

use common::{crate_dir, lib_dir};

fn read(rel: &str) -> String {
    std::fs::read_to_string(crate_dir().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The header without comments, whitespace collapsed.
fn header_code() -> String {
    let h = read("include/ccl.h");
    let mut out = String::new();
    let mut rest = h.as_str();
    while let Some(i) = rest.find("/*") {
        out.push_str(&rest[..i]);
        let j = rest[i..].find("*/").expect("unterminated comment") + i + 2;
        rest = &rest[j..];
    }
    out.push_str(rest);
    out
}

/// C type (parameter name removed) in Rust spelling: `const void*` -> `*const c_void`.
fn c_to_rust(c: &str) -> String {
    let c = c.replace('*', " * ");
    let mut toks: Vec<&str> = c.split_whitespace().collect();
    let mut ptrs = Vec::new();
    while toks.last() == Some(&"*") {
        toks.pop();
        ptrs.push(());
    }
    let is_const = toks.first() == Some(&"const");
    if is_const {
        toks.remove(0);
    }
    assert_eq!(toks.len(), 1, "unexpected C type '{c}'");
    let base = match toks[0] {
        "int" => "c_int",
        "void" => "c_void",
        "char" => "c_char",
        "size_t" => "usize",
        t => t,
    };
    let mut s = base.to_string();
    for (k, ()) in ptrs.iter().enumerate() {
        // `const` binds to the pointee of the innermost pointer; a top-level `const` on a
        // by-value parameter (`const cclComm_t comm`) does not change the ABI.
        let q = if is_const && k == 0 {
            "*const "
        } else {
            "*mut "
        };
        s = format!("{q}{s}");
    }
    s
}

/// Prototypes of the header: name -> (return type, parameter types), in Rust spelling.
fn header_functions() -> BTreeMap<String, (String, Vec<String>)> {
    let all = header_code();
    let code: Vec<&str> = all
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .collect();
    let code = code.join("\n").replace("extern \"C\" {", "");
    let mut m = BTreeMap::new();
    for stmt in code.split(';') {
        let s = stmt.split_whitespace().collect::<Vec<_>>().join(" ");
        let s = s.trim_start_matches('}').trim();
        if s.starts_with("typedef") || !s.contains('(') {
            continue;
        }
        let open = s.find('(').expect("has (");
        let close = s.rfind(')').expect("prototype ends with )");
        let head = s[..open].trim();
        let split = head
            .rfind(|c: char| !(c.is_alphanumeric() || c == '_'))
            .expect("return type before the name");
        let (ret, name) = (head[..=split].trim(), head[split + 1..].to_string());
        let params: Vec<String> = s[open + 1..close]
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty() && *p != "void")
            .map(|p| {
                let p = p.replace('*', "* ");
                let mut toks: Vec<&str> = p.split_whitespace().collect();
                toks.pop(); // the parameter name
                c_to_rust(&toks.join(" "))
            })
            .collect();
        let ret = c_to_rust(ret);
        assert!(
            m.insert(name.clone(), (ret, params)).is_none(),
            "{name} declared twice"
        );
    }
    m
}

/// `pub extern "C" fn` exports of the crate's sources: name -> (return type, parameter types).
fn rust_functions() -> BTreeMap<String, (String, Vec<String>)> {
    let mut m = BTreeMap::new();
    for f in ["lib.rs", "colls.rs", "group.rs", "vcolls.rs", "mem.rs"] {
        let src = read(&format!("src/{f}"));
        for part in src.split("#[unsafe(no_mangle)]").skip(1) {
            let sig_start = part.find("extern \"C\" fn ").expect("export is extern C") + 14;
            let sig = &part[sig_start..part.find('{').expect("fn body")];
            let sig = sig.split_whitespace().collect::<Vec<_>>().join(" ");
            let open = sig.find('(').unwrap();
            let close = sig.rfind(')').unwrap();
            let name = sig[..open].trim().to_string();
            let params: Vec<String> = sig[open + 1..close]
                .split(',')
                .map(str::trim)
                .filter(|p| !p.is_empty())
                .map(|p| p.split_once(':').expect("name: type").1.trim().to_string())
                .collect();
            let ret = sig[close + 1..]
                .trim()
                .trim_start_matches("->")
                .trim()
                .to_string();
            m.insert(name, (ret, params));
        }
    }
    m
}

#[test]
fn prototypes_match_the_exports() {
    let h = header_functions();
    let r = rust_functions();
    assert!(
        h.len() >= 30,
        "parsed only {} prototypes from the header",
        h.len()
    );
    let hn: Vec<_> = h.keys().collect();
    let rn: Vec<_> = r.keys().collect();
    assert_eq!(
        hn, rn,
        "the header and the Rust exports name different functions"
    );
    for (name, (hret, hparams)) in &h {
        let (rret, rparams) = &r[name];
        assert_eq!(hret, rret, "{name}: return type");
        assert_eq!(hparams, rparams, "{name}: parameters");
    }
}

/// A decimal or `0x` hexadecimal integer literal (Rust digit separators allowed).
fn number(v: &str) -> Option<i64> {
    let v = v.replace('_', "");
    match v.strip_prefix("0x") {
        Some(h) => i64::from_str_radix(h, 16).ok(),
        None => v.parse().ok(),
    }
}

/// `name = value` pairs of the header's enums and `#define NAME number` macros.
fn header_constants() -> BTreeMap<String, i64> {
    let code = header_code();
    let mut m = BTreeMap::new();
    for line in code.lines() {
        let l = line.trim().trim_end_matches(',');
        if let Some(rest) = l.strip_prefix("#define ") {
            let mut it = rest.split_whitespace();
            if let (Some(n), Some(v), None) = (it.next(), it.next(), it.next())
                && let Some(v) = number(v)
            {
                m.insert(n.to_string(), v);
            }
        } else if let Some((n, v)) = l.split_once(" = ")
            && let Some(v) = number(v.trim())
        {
            m.insert(n.trim().to_string(), v);
        }
    }
    m
}

/// `pub const NAME: T = value;` of the crate root.
fn rust_constants() -> BTreeMap<String, i64> {
    let src = read("src/lib.rs");
    let mut m = BTreeMap::new();
    for line in src.lines() {
        let Some(rest) = line.trim().strip_prefix("pub const ") else {
            continue;
        };
        let (name, rest) = rest.split_once(':').unwrap();
        let v = rest.split_once('=').unwrap().1.trim().trim_end_matches(';');
        if let Some(v) = number(v) {
            m.insert(name.trim().to_string(), v);
        }
    }
    m
}

#[test]
fn constants_match() {
    let h = header_constants();
    let r = rust_constants();
    for (name, v) in &r {
        assert_eq!(h.get(name), Some(v), "{name}: Rust has {v}");
    }
    for name in h.keys() {
        if name.starts_with("ccl") {
            assert!(r.contains_key(name), "{name} is in the header only");
        }
    }
    assert_eq!(h["CCL_UNIQUE_ID_BYTES"], oxccl::UNIQUE_ID_BYTES as i64);
    // The version macros are the crate's version.
    let v = |k: &str| h[k].to_string();
    assert_eq!(
        format!("{}.{}.{}", v("CCL_MAJOR"), v("CCL_MINOR"), v("CCL_PATCH")),
        env!("CARGO_PKG_VERSION")
    );
    // The library's own types agree with NCCL's numbering as the header states it.
    for t in oxccl::DataType::ALL {
        assert!(h.values().any(|&x| x == t as i64));
    }
    assert_eq!(h["cclNumTypes"], oxccl::DataType::ALL.len() as i64);
    assert_eq!(h["cclNumOps"], oxccl::ReduceOp::ALL.len() as i64);
    assert_eq!(h["cclBfloat16"], oxccl::DataType::Bf16 as i64);
    assert_eq!(h["cclAvg"], oxccl::ReduceOp::Avg as i64);
    assert_eq!(h["cclBAnd"], oxccl::ReduceOp::BAnd as i64);
    assert_eq!(h["cclBXor"], oxccl::ReduceOp::BXor as i64);
    assert!(r.contains_key("CCL_CONFIG_MAGIC"), "the magic is compared");
}

#[test]
fn shared_library_exports_exactly_the_header() {
    let so = lib_dir().join("libccl.so");
    let o = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(&so)
        .output()
        .expect("run nm (binutils)");
    assert!(o.status.success(), "nm failed");
    let text = String::from_utf8_lossy(&o.stdout);
    let exported: Vec<String> = text
        .lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let (_, kind, name) = (it.next()?, it.next()?, it.next()?);
            (kind == "T").then(|| name.to_string())
        })
        .filter(|n| n.starts_with("ccl"))
        .collect();
    let mut exported = exported;
    exported.sort();
    let header: Vec<String> = header_functions().into_keys().collect();
    assert_eq!(
        exported, header,
        "libccl.so exports differ from include/ccl.h"
    );
    // Nothing but the C API (and no Rust symbols) leaks out of the cdylib.
    let others: Vec<&str> = text
        .lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let (_, kind, name) = (it.next()?, it.next()?, it.next()?);
            (kind == "T" && !name.starts_with("ccl")).then_some(name)
        })
        .collect();
    assert!(others.is_empty(), "unexpected exports: {others:?}");
}
