//! Writing the header, the ctypes declarations and the C++ function list from [`layout`].
//!
//! Types arrive as the compiler's spelling of the Rust type (`*const c_void`,
//! `[c_char; CCL_UNIQUE_ID_BYTES]`); each is parsed into [`Ty`] and written in C or ctypes. A
//! type this file does not know is a panic naming it: the generator's test fails, instead of
//! writing a declaration it guessed.

use std::collections::BTreeSet;
use std::fmt::Write;

use super::layout::layout;
use super::{CEnum, CFn, CStruct, Define, Item};

/// Lines of C this file writes at most (longer prototypes wrap).
const WIDTH: usize = 98;

/// How the files say where they come from; `lead` starts the second line.
fn generated(lead: &str) -> String {
    format!(
        "generated from ccl-capi's exports by\n{lead}`CCL_ABI_WRITE=1 cargo test -p ccl-capi \
         --lib abi`; do not edit"
    )
}

/// A Rust FFI type.
#[derive(Debug, PartialEq)]
enum Ty {
    Named(String),
    Ptr { constant: bool, to: Box<Ty> },
    Array { of: Box<Ty>, len: String },
}

impl Ty {
    fn parse(rust: &str) -> Ty {
        let s: String = rust.chars().filter(|c| !c.is_whitespace()).collect();
        Self::parse_compact(&s)
    }

    fn parse_compact(s: &str) -> Ty {
        if let Some(rest) = s.strip_prefix("*const") {
            return Ty::Ptr {
                constant: true,
                to: Box::new(Self::parse_compact(rest)),
            };
        }
        if let Some(rest) = s.strip_prefix("*mut") {
            return Ty::Ptr {
                constant: false,
                to: Box::new(Self::parse_compact(rest)),
            };
        }
        if let Some(inner) = s.strip_prefix('[').and_then(|r| r.strip_suffix(']')) {
            let (of, len) = inner
                .rsplit_once(';')
                .unwrap_or_else(|| panic!("array type without a length: {s}"));
            return Ty::Array {
                of: Box::new(Self::parse_compact(of)),
                len: len.to_string(),
            };
        }
        assert!(
            !s.is_empty() && s.chars().all(|c| c.is_alphanumeric() || c == '_'),
            "not a type the C ABI writer knows: {s}"
        );
        Ty::Named(s.to_string())
    }
}

/// What the writers know beyond a type's spelling: which names are the ABI's own.
struct Names {
    enums: BTreeSet<&'static str>,
    structs: BTreeSet<&'static str>,
    handles: BTreeSet<&'static str>,
    int_defines: BTreeSet<&'static str>,
}

impl Names {
    fn of(items: &[Item]) -> Names {
        let mut n = Names {
            enums: BTreeSet::new(),
            structs: BTreeSet::new(),
            handles: BTreeSet::new(),
            int_defines: BTreeSet::new(),
        };
        for item in items {
            match item {
                Item::Enum(e) => drop(n.enums.insert(e.name)),
                Item::Struct(s) => drop(n.structs.insert(s.name)),
                Item::Handle { name, .. } => drop(n.handles.insert(name)),
                Item::Define(d) if d.int.is_some() => drop(n.int_defines.insert(d.name)),
                _ => {}
            }
        }
        n
    }

    fn is_own(&self, name: &str) -> bool {
        self.enums.contains(name) || self.structs.contains(name) || self.handles.contains(name)
    }

    /// The C spelling of a scalar or named type.
    fn c_named(&self, name: &str) -> String {
        match name {
            "c_void" => "void".into(),
            "c_int" => "int".into(),
            "c_uint" => "unsigned int".into(),
            "c_char" => "char".into(),
            "usize" => "size_t".into(),
            n if self.is_own(n) => n.into(),
            n => panic!("no C spelling for the Rust type {n}"),
        }
    }

    /// A declaration of `name` with type `ty` in C (`const void* sendbuff`).
    fn c_decl(&self, ty: &Ty, name: &str) -> String {
        match ty {
            Ty::Array { of, len } => format!("{} {name}[{len}]", self.c_type(of)),
            t if name.is_empty() => self.c_type(t),
            t => format!("{} {name}", self.c_type(t)),
        }
    }

    fn c_type(&self, ty: &Ty) -> String {
        match ty {
            Ty::Named(n) => self.c_named(n),
            Ty::Ptr { constant, to } => match (constant, &**to) {
                (true, Ty::Named(n)) => format!("const {}*", self.c_named(n)),
                (true, t) => panic!("a const pointer to {t:?} has no C spelling here"),
                (false, t) => format!("{}*", self.c_type(t)),
            },
            Ty::Array { .. } => panic!("an array is only a struct field here"),
        }
    }

    /// The ctypes spelling (names of `_abi.py`).
    fn py_type(&self, ty: &Ty) -> String {
        match ty {
            Ty::Named(n) => match n.as_str() {
                "c_int" => "c_int".into(),
                "c_uint" => "ctypes.c_uint".into(),
                "c_char" => "ctypes.c_char".into(),
                "usize" => "c_size_t".into(),
                n if self.enums.contains(n) => "c_int".into(),
                n if self.handles.contains(n) => "Handle".into(),
                n if self.structs.contains(n) => py_struct(n),
                n => panic!("no ctypes spelling for the Rust type {n}"),
            },
            Ty::Ptr { to, .. } => match &**to {
                Ty::Named(n) => match n.as_str() {
                    "c_void" => "c_void_p".into(),
                    // A returned C string; ctypes gives bytes.
                    "c_char" => "ctypes.c_char_p".into(),
                    "c_int" => "c_int_p".into(),
                    "usize" => "c_size_t_p".into(),
                    n if self.handles.contains(n) => "Handle_p".into(),
                    _ => format!("ctypes.POINTER({})", self.py_type(to)),
                },
                t => format!("ctypes.POINTER({})", self.py_type(t)),
            },
            // A char array is opaque bytes (the unique id): c_char arrays read as strings that
            // end at the first zero byte, so bytes go as unsigned.
            Ty::Array { of, len } => {
                let elem = match &**of {
                    Ty::Named(n) if n == "c_char" => "ctypes.c_ubyte".to_string(),
                    t => self.py_type(t),
                };
                let len = match len.strip_prefix("CCL_") {
                    Some(short) if self.int_defines.contains(len.as_str()) => short.to_string(),
                    _ => len.clone(),
                };
                format!("{elem} * {len}")
            }
        }
    }
}

/// The ctypes class of a struct: `cclUniqueId` -> `UniqueIdStruct`.
fn py_struct(name: &str) -> String {
    let n = name.trim_start_matches("ccl").trim_end_matches("_t");
    format!("{n}Struct")
}

/// Doc comment lines without rustdoc's leading space.
fn doc_lines(doc: &[&str]) -> Vec<String> {
    doc.iter()
        .map(|l| l.strip_prefix(' ').unwrap_or(l).trim_end().to_string())
        .collect()
}

/// A C comment of `doc` at `indent`, or nothing.
fn c_comment(out: &mut String, doc: &[&str], indent: &str) {
    let lines = doc_lines(doc);
    for (i, l) in lines.iter().enumerate() {
        let lead = if i == 0 { "/*" } else { " *" };
        let sep = if l.is_empty() { "" } else { " " };
        let end = if i + 1 == lines.len() { " */" } else { "" };
        let _ = writeln!(out, "{indent}{lead}{sep}{l}{end}");
    }
}

/// `head(a, b, ...)` + `tail`, wrapped at [`WIDTH`] with continuation lines under the first
/// argument.
fn wrap_call(head: &str, args: &[String], tail: &str) -> String {
    let indent = " ".repeat(head.len() + 1);
    let mut out = format!("{head}(");
    let mut line_len = out.len();
    for (i, a) in args.iter().enumerate() {
        let last = i + 1 == args.len();
        let piece = if last {
            format!("{a}){tail}")
        } else {
            format!("{a},")
        };
        let sep = if i == 0 { "" } else { " " };
        if i > 0 && line_len + sep.len() + piece.len() > WIDTH {
            out.push('\n');
            out.push_str(&indent);
            line_len = indent.len();
        } else {
            out.push_str(sep);
            line_len += sep.len();
        }
        out.push_str(&piece);
        line_len += piece.len();
    }
    if args.is_empty() {
        let _ = write!(out, "void){tail}");
    }
    out
}

fn c_enum(out: &mut String, e: &CEnum) {
    c_comment(out, e.doc, "");
    out.push_str("typedef enum {\n");
    for (i, v) in e.values.iter().enumerate() {
        c_comment(out, v.doc, "  ");
        let comma = if i + 1 == e.values.len() { "" } else { "," };
        let _ = writeln!(out, "  {} = {}{comma}", v.name, v.value);
    }
    let _ = writeln!(out, "}} {};\n", e.name);
}

fn c_struct(out: &mut String, n: &Names, s: &CStruct) {
    c_comment(out, s.doc, "");
    match s.name.strip_suffix("_t") {
        Some(tag) => {
            let _ = writeln!(out, "typedef struct {tag} {{");
        }
        None => out.push_str("typedef struct {\n"),
    }
    for f in s.fields {
        c_comment(out, f.doc, "  ");
        let _ = writeln!(out, "  {};", n.c_decl(&Ty::parse(f.ty), f.name));
    }
    let _ = writeln!(out, "}} {};", s.name);
}

fn c_define(out: &mut String, d: &Define) {
    c_comment(out, d.doc, "");
    let _ = writeln!(out, "#define {} {}", d.name, d.c);
}

/// A parameter's name as C sees it (`_comm`, unused in Rust, is `comm`).
fn param_name(p: &str) -> &str {
    p.trim_start_matches('_')
}

fn c_fn(out: &mut String, n: &Names, f: &CFn) {
    c_comment(out, f.doc, "");
    let ret = n.c_type(&Ty::parse(f.ret));
    let args: Vec<String> = f
        .params
        .iter()
        .map(|(p, t)| n.c_decl(&Ty::parse(t), param_name(p)))
        .collect();
    // `const char* f(` keeps the star with the type, as the rest of the header does.
    out.push_str(&wrap_call(&format!("{ret} {}", f.name), &args, ";"));
    out.push('\n');
}

const HEADER_TOP: &str = "\
/*
 * ccl.h: the C interface of ccl, a collective-communication library for host memory.
 *
 * Shaped like NCCL's nccl.h, so code written for NCCL ports by renaming (nccl -> ccl, NCCL ->
 * CCL) and dropping the CUDA stream argument: buffers are ordinary host memory and blocking
 * calls return when the operation is complete on this rank. Link with -lccl (libccl.so or
 * libccl.a; the static library also needs -lpthread -ldl -lm, which C libraries since glibc
 * 2.34 hold themselves; no verbs library: the verbs transport opens libibverbs at run time).
 *
 * Every function checks its arguments and never lets a failure cross into the caller: NULL
 * pointers where a pointer is needed, counts whose buffers would not fit the address space,
 * values outside the enums, unknown, destroyed or forged communicator and request handles, and
 * any internal failure come back as a result code, with a message from cclGetLastError().
 * Pointers that are not NULL must point to memory of the documented size; that cannot be
 * checked.
 *
 * Threads: every function may be called from any thread. A communicator may be used by several
 * threads; its operations run in the order they were issued on this rank, and every rank must
 * issue the same collectives in the same order (as with NCCL and MPI).
 *
";

/// `include/ccl.h`.
pub(crate) fn render_header() -> String {
    let items = layout();
    let n = Names::of(&items);
    let mut out = String::from(HEADER_TOP);
    let _ = writeln!(out, " * This file is {}.\n */", generated(" * "));
    out.push_str(
        "#ifndef CCL_H_\n#define CCL_H_\n\n#include <limits.h>\n#include <stddef.h>\n\n\
         #ifdef __cplusplus\nextern \"C\" {\n#endif\n",
    );
    let mut prev_define = false;
    for item in &items {
        // Undocumented defines run together; anything else stands apart.
        let is_define = matches!(item, Item::Define(d) if d.doc.is_empty());
        if !(is_define && prev_define) {
            out.push('\n');
        }
        prev_define = is_define;
        match item {
            Item::Section(title, doc) => {
                let head = format!("/* ---- {title} ");
                let rule = "-".repeat((WIDTH - 4).saturating_sub(head.len() + 3).max(4));
                if doc.is_empty() {
                    let _ = writeln!(out, "{head}{rule} */");
                } else {
                    let _ = writeln!(out, "{head}{rule}\n *");
                    for l in doc_lines(doc) {
                        let sep = if l.is_empty() { "" } else { " " };
                        let _ = writeln!(out, " *{sep}{l}");
                    }
                    out.push_str(" */\n");
                }
            }
            Item::Handle { name, tag, doc } => {
                c_comment(&mut out, doc, "");
                let _ = writeln!(out, "typedef struct {tag}* {name};");
            }
            Item::Define(d) => c_define(&mut out, d),
            Item::Enum(e) => c_enum(&mut out, e),
            Item::Struct(s) => c_struct(&mut out, &n, s),
            Item::Fn(f) => c_fn(&mut out, &n, f),
        }
    }
    out.push_str("\n#ifdef __cplusplus\n} /* extern \"C\" */\n#endif\n\n#endif /* CCL_H_ */\n");
    out
}

/// A Python list or call wrapped at [`WIDTH`]: on one line if it fits, else one item a line.
fn py_list(indent: &str, head: &str, open: &str, items: &[String], close: &str) -> String {
    let one = format!("{indent}{head}{open}{}{close}", items.join(", "));
    if one.len() <= WIDTH {
        return one;
    }
    let mut s = format!("{indent}{head}{open}\n");
    for it in items {
        let _ = writeln!(s, "{indent}    {it},");
    }
    let _ = write!(s, "{indent}{close}");
    s
}

/// `python/oxccl/_abi.py`.
pub(crate) fn render_python() -> String {
    let items = layout();
    let n = Names::of(&items);
    let mut out = format!(
        "\"\"\"The C ABI (include/ccl.h) for ctypes: {}.\"\"\"\n\n\
         import ctypes\n\n\
         c_int = ctypes.c_int\n\
         c_size_t = ctypes.c_size_t\n\
         c_void_p = ctypes.c_void_p\n\
         c_int_p = ctypes.POINTER(ctypes.c_int)\n\
         c_size_t_p = ctypes.POINTER(ctypes.c_size_t)\n\n\
         # Handles are opaque pointers ({}).\n\
         Handle = c_void_p\n\
         Handle_p = ctypes.POINTER(c_void_p)\n\n\
         # The integer #defines, without CCL_.\n",
        generated(""),
        n.handles.iter().copied().collect::<Vec<_>>().join(", ")
    );
    for item in &items {
        if let Item::Define(Define {
            name, int: Some(v), ..
        }) = item
        {
            let _ = writeln!(out, "{} = {v}", name.trim_start_matches("CCL_"));
        }
    }
    out.push_str("\n# Each enum's values by name.\nENUMS = {\n");
    for item in &items {
        if let Item::Enum(e) = item {
            let vals: Vec<String> = e
                .values
                .iter()
                .map(|v| format!("\"{}\": {}", v.name, v.value))
                .collect();
            let _ = writeln!(
                out,
                "{},",
                py_list("    ", &format!("\"{}\": ", e.name), "{", &vals, "}")
            );
        }
    }
    out.push_str("}\n");
    for item in &items {
        if let Item::Struct(s) = item {
            let _ = write!(
                out,
                "\n\nclass {}(ctypes.Structure):\n    \"\"\"{}.\"\"\"\n\n",
                py_struct(s.name),
                s.name
            );
            let fields: Vec<String> = s
                .fields
                .iter()
                .map(|f| format!("(\"{}\", {})", f.name, n.py_type(&Ty::parse(f.ty))))
                .collect();
            let _ = writeln!(out, "{}", py_list("    ", "_fields_ = ", "[", &fields, "]"));
        }
    }
    out.push_str("\n\n# name: (return type, argument types)\nPROTOTYPES = {\n");
    for item in &items {
        if let Item::Fn(f) = item {
            let args: Vec<String> = f
                .params
                .iter()
                .map(|(_, t)| n.py_type(&Ty::parse(t)))
                .collect();
            let head = format!("\"{}\": ({}, ", f.name, n.py_type(&Ty::parse(f.ret)));
            let line = py_list("    ", &head, "[", &args, "]),");
            let _ = writeln!(out, "{line}");
        }
    }
    out.push_str("}\n");
    out
}

/// `python/oxccl/csrc/ccl_functions.hpp`.
pub(crate) fn render_cpp() -> String {
    let mut out = format!(
        "// Every function of the C ABI (ccl.h), for X-macros: {}.\n\
         #pragma once\n\n#define CCL_FUNCTIONS(X) \\\n",
        generated("// ")
    );
    let names: Vec<&str> = layout()
        .iter()
        .filter_map(|i| match i {
            Item::Fn(f) => Some(f.name),
            _ => None,
        })
        .collect();
    for (i, name) in names.iter().enumerate() {
        let cont = if i + 1 == names.len() { "" } else { " \\" };
        let _ = writeln!(out, "  X({name}){cont}");
    }
    out
}

/// The type writers, for the unit tests.
#[cfg(test)]
pub(super) mod tests_support {
    use super::{Item, Names, Ty};

    pub(crate) struct TestNames(Names);

    pub(crate) fn names(items: &[Item]) -> TestNames {
        TestNames(Names::of(items))
    }

    pub(crate) fn c_decl(n: &TestNames, rust: &str, param: &str) -> String {
        n.0.c_decl(&Ty::parse(rust), param)
    }

    pub(crate) fn py_type(n: &TestNames, rust: &str) -> String {
        n.0.py_type(&Ty::parse(rust))
    }
}
