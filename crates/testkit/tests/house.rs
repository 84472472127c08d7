//! The house rules that a reader relies on: within each crate, modules depend on each other
//! without cycles, so each can be read on top of the ones it uses; and `core` uses nothing of
//! ours.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// What a module uses when it names an item of the crate's root.
const ROOT: &str = "crate root";

/// The modules `text` names through `crate::`: top-level ones, and in a layer's folder (one
/// in `layers`) the module within it.
fn uses(text: &str, layers: &BTreeSet<String>) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    let word =
        |s: &str| s.split(|c: char| !(c.is_alphanumeric() || c == '_')).next().unwrap_or("").to_string();
    // `front::rls::…` is the module `front::rls`; `front::Item` or `store::…` the top one.
    let module = |path: &str| -> String {
        let first = word(path);
        match path[first.len()..].strip_prefix("::").map(word) {
            Some(second) if layers.contains(&first) && is_module(&second) => format!("{first}::{second}"),
            _ => first,
        }
    };
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        // `crate::{a, b}`, or `crate::layer::{a, b}` (each item within the layer).
        let first = word(rest);
        let (within, group) = match rest.strip_prefix('{') {
            Some(group) => (String::new(), Some(group)),
            None => match rest[first.len()..].strip_prefix("::{") {
                Some(group) => (format!("{first}::"), Some(group)),
                None => (String::new(), None),
            },
        };
        let names: Vec<String> = match group {
            Some(group) => {
                let end = group.find('}').unwrap_or(group.len());
                group[..end].split(',').map(|item| module(&format!("{within}{}", item.trim()))).collect()
            }
            None => vec![module(rest)],
        };
        // An item named at the crate's root (`crate::Tollgate`) is a use of the root, which
        // declares, and so uses, every module.
        out.extend(
            names
                .into_iter()
                .filter(|n| !n.is_empty())
                .map(|n| if is_module(&n) { n } else { ROOT.to_string() }),
        );
    }
    out
}

/// Whether `name` names a module rather than an item (`Tollgate`).
fn is_module(name: &str) -> bool {
    !name.is_empty() && name.chars().all(|c| c.is_lowercase() || c.is_ascii_digit() || c == '_' || c == ':')
}

/// The folders of `src` that only gather modules (their `mod.rs` declares modules and holds
/// nothing else): the layers, whose modules count one by one.
fn layers(src: &Path) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for entry in std::fs::read_dir(src).unwrap() {
        let path = entry.unwrap().path();
        let Ok(text) = std::fs::read_to_string(path.join("mod.rs")) else { continue };
        let gathers = text.lines().map(str::trim).all(|l| {
            l.is_empty()
                || l.starts_with("//")
                || l.starts_with("#[cfg")
                || (l.contains("mod ") && l.ends_with(';'))
        });
        if gathers {
            out.insert(path.file_name().unwrap().to_string_lossy().into_owned());
        }
    }
    out
}

/// For one crate: each top-level module and the top-level modules it uses.
fn graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    sources(src, &mut files);
    let layers = layers(src);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in files {
        let rel = file.strip_prefix(src).unwrap();
        let parts: Vec<String> = rel
            .components()
            .map(|c| c.as_os_str().to_string_lossy().trim_end_matches(".rs").to_string())
            .collect();
        let top = match parts.as_slice() {
            [layer, module, ..] if layers.contains(layer) && module != "mod" => format!("{layer}::{module}"),
            [first, ..] => first.clone(),
            [] => continue,
        };
        if top == "lib" || top == "main" || layers.contains(&top) {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        // Tests inside a module may reach anywhere, and docs may point anywhere: only the
        // module's own code counts.
        let code: String = text
            .split("#[cfg(test)]")
            .next()
            .unwrap_or("")
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        let code = code.as_str();
        let used = graph.entry(top.clone()).or_default();
        used.extend(uses(code, &layers).into_iter().filter(|m| *m != top));
    }
    let mut modules: BTreeSet<String> = graph.keys().cloned().collect();
    graph.insert(ROOT.to_string(), modules.clone());
    modules.insert(ROOT.to_string());
    for used in graph.values_mut() {
        used.retain(|m| modules.contains(m));
    }
    graph
}

/// A cycle in `graph`, if there is one.
fn cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == node) {
            let mut c = path[i..].to_vec();
            c.push(node.to_string());
            return Some(c);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(c) = visit(next, graph, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph.keys().find_map(|n| visit(n, graph, &mut Vec::new(), &mut done))
}

#[test]
fn no_crate_has_an_import_cycle_between_its_modules() {
    let crates = workspace().join("crates");
    let mut checked = 0;
    for entry in std::fs::read_dir(&crates).unwrap() {
        let src = entry.unwrap().path().join("src");
        if !src.is_dir() {
            continue;
        }
        let graph = graph(&src);
        if let Some(c) = cycle(&graph) {
            panic!("{}: modules import each other in a cycle: {}", src.display(), c.join(" -> "));
        }
        checked += graph.len();
    }
    assert!(checked > 30, "only {checked} modules found");
}

#[test]
fn the_cycle_finder_finds_cycles() {
    let g: BTreeMap<String, BTreeSet<String>> = [("a", "b"), ("b", "c"), ("c", "a")]
        .into_iter()
        .map(|(from, to)| (from.to_string(), BTreeSet::from([to.to_string()])))
        .collect();
    assert_eq!(cycle(&g).unwrap(), ["a", "b", "c", "a"]);
    let none = BTreeSet::new();
    assert_eq!(
        uses(
            "use crate::{group::Group, inner::Inner};\nlet x = crate::tally::record; use crate::Tollgate;",
            &none
        ),
        BTreeSet::from(["group".into(), "inner".into(), "tally".into(), ROOT.into()])
    );
    let front = BTreeSet::from(["front".to_string()]);
    assert_eq!(
        uses(
            "use crate::front::rls::RlsRules; use crate::store::etcd::X; use crate::front::{conn, listen::Tls};",
            &front
        ),
        BTreeSet::from(["front::rls".into(), "store".into(), "front::conn".into(), "front::listen".into()])
    );
}

#[test]
fn core_uses_nothing_of_ours() {
    let manifest = std::fs::read_to_string(workspace().join("crates/core/Cargo.toml")).unwrap();
    let dependencies = manifest.split("[dependencies]").nth(1).unwrap_or("");
    let dependencies = dependencies.split("\n[").next().unwrap_or("");
    assert!(
        !dependencies.contains("tollgate-"),
        "crates/core depends on another Tollgate crate: {dependencies}"
    );
}

/// `text` with every comment, string and character literal blanked out (newlines kept, so
/// lines still count), leaving code whose braces can be matched.
fn code_only(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let blank = |out: &mut String, s: &[u8]| {
        out.extend(s.iter().map(|&c| if c == b'\n' { '\n' } else { ' ' }));
    };
    while i < b.len() {
        let rest = &b[i..];
        let end = if rest.starts_with(b"//") {
            rest.iter().position(|&c| c == b'\n').unwrap_or(rest.len())
        } else if rest.starts_with(b"/*") {
            rest.windows(2).position(|w| w == b"*/").map_or(rest.len(), |p| p + 2)
        } else if rest[0] == b'r' && (rest.get(1) == Some(&b'"') || rest.get(1) == Some(&b'#')) {
            let hashes = rest[1..].iter().take_while(|&&c| c == b'#').count();
            if rest.get(1 + hashes) != Some(&b'"') {
                0
            } else {
                let close: Vec<u8> = std::iter::once(b'"').chain(std::iter::repeat_n(b'#', hashes)).collect();
                let body = 2 + hashes;
                rest[body..]
                    .windows(close.len())
                    .position(|w| w == close.as_slice())
                    .map_or(rest.len(), |p| body + p + close.len())
            }
        } else if rest[0] == b'"' {
            let mut j = 1;
            while j < rest.len() && rest[j] != b'"' {
                j += if rest[j] == b'\\' { 2 } else { 1 };
            }
            (j + 1).min(rest.len())
        } else if rest[0] == b'\'' {
            // A character literal ('x', '\n', '{'), not a lifetime ('a).
            match (rest.get(1), rest.get(2), rest.get(3)) {
                (Some(b'\\'), _, _) => rest[2..].iter().position(|&c| c == b'\'').map_or(1, |p| p + 3),
                (Some(_), Some(b'\''), _) => 3,
                _ => 0,
            }
        } else {
            0
        };
        if end == 0 {
            out.push(b[i] as char);
            i += 1;
        } else {
            blank(&mut out, &rest[..end]);
            i += end;
        }
    }
    out
}

/// Each function in `text` with a body: its name, the line it starts on and its length in
/// lines.
fn functions(text: &str) -> Vec<(String, usize, usize)> {
    let code = code_only(text);
    let lines: Vec<&str> = code.lines().collect();
    let mut found = Vec::new();
    for (start, line) in lines.iter().enumerate() {
        let Some(at) = line.find("fn ") else { continue };
        if at > 0 && line.as_bytes()[at - 1].is_ascii_alphanumeric() {
            continue;
        }
        let name: String = line[at + 3..].chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        if name.is_empty() {
            continue;
        }
        // The body: from the first `{` after the name (none before a `;`: a declaration) to
        // its match.
        let (mut depth, mut opened) = (0i32, false);
        'lines: for (end, l) in lines.iter().enumerate().skip(start) {
            let from = if end == start { at } else { 0 };
            for c in l[from..].chars() {
                match c {
                    ';' if !opened => break 'lines,
                    '{' => {
                        depth += 1;
                        opened = true;
                    }
                    '}' => depth -= 1,
                    _ => {}
                }
                if opened && depth == 0 {
                    found.push((name.clone(), start + 1, end - start + 1));
                    break 'lines;
                }
            }
        }
    }
    found
}

/// The longest function in `crates/core/src`, in lines.
const CORE_FUNCTION_MAX: usize = 80;
/// The longest function anywhere else (tests included), in lines.
const FUNCTION_MAX: usize = 120;

#[test]
fn functions_are_short_enough_to_read_at_once() {
    let mut files = Vec::new();
    sources(&workspace().join("crates"), &mut files);
    let core = workspace().join("crates/core/src");
    let mut long = Vec::new();
    for file in &files {
        let most = if file.starts_with(&core) { CORE_FUNCTION_MAX } else { FUNCTION_MAX };
        let text = std::fs::read_to_string(file).unwrap();
        for (name, line, len) in functions(&text) {
            if len > most {
                long.push(format!("{}:{line} fn {name}: {len} lines (at most {most})", file.display()));
            }
        }
    }
    assert!(files.len() > 50, "only {} files found", files.len());
    assert!(long.is_empty(), "functions too long to read at once:\n{}", long.join("\n"));
}

#[test]
fn the_function_finder_skips_strings_comments_and_characters() {
    let text = "fn a() {\n    let s = \"}}\n{\";\n    let c = '{';\n    // }\n    let r = r#\"}\"#;\n}\nfn b<'x>(v: &'x str);\nfn c() { 1 }\n";
    assert_eq!(functions(text), [("a".to_string(), 1, 7), ("c".to_string(), 9, 1)]);
}

#[test]
fn every_public_error_enum_may_grow() {
    let mut files = Vec::new();
    sources(&workspace().join("crates"), &mut files);
    let mut closed = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let Some(name) = line.strip_prefix("pub enum ") else { continue };
            // The attributes right above the enum.
            let attributes: Vec<&str> =
                lines[..i].iter().rev().take_while(|l| l.trim_start().starts_with("#[")).copied().collect();
            let error = attributes.iter().any(|a| a.contains("Error)") || a.contains("Error,"))
                || name.contains("Error")
                || name.starts_with("Refus");
            if error && !attributes.iter().any(|a| a.contains("non_exhaustive")) {
                closed.push(format!("{}:{} pub enum {name}", file.display(), i + 1));
            }
        }
    }
    assert!(closed.is_empty(), "public error enums without #[non_exhaustive]:\n{}", closed.join("\n"));
}

/// The bodies of `impl NAME {` blocks (no trait impls) in the files under `dir`, code only.
fn impl_bodies(dir: &Path, name: &str) -> Vec<String> {
    let mut files = Vec::new();
    sources(dir, &mut files);
    let head = format!("impl {name} {{");
    let mut out = Vec::new();
    for file in files {
        let code = code_only(&std::fs::read_to_string(&file).unwrap());
        let code = code.split("#[cfg(test)]").next().unwrap_or("").to_string();
        let mut rest = code.as_str();
        while let Some(at) = rest.find(&head) {
            let body = &rest[at + head.len()..];
            let mut depth = 1;
            let end = body
                .char_indices()
                .find(|&(_, c)| {
                    depth += match c {
                        '{' => 1,
                        '}' => -1,
                        _ => 0,
                    };
                    depth == 0
                })
                .map_or(body.len(), |(i, _)| i);
            out.push(body[..end].to_string());
            rest = &body[end..];
        }
    }
    out
}

/// Lines and public methods of a type's inherent impls.
fn hub(dir: &Path, name: &str) -> (usize, usize) {
    let bodies = impl_bodies(dir, name);
    let lines = bodies.iter().map(|b| b.lines().count()).sum();
    let public = bodies.iter().flat_map(|b| b.lines()).filter(|l| l.starts_with("    pub fn ")).count();
    (lines, public)
}

/// The fields of `pub struct NAME {` in `file`.
fn fields(file: &Path, name: &str) -> usize {
    let code = code_only(&std::fs::read_to_string(file).unwrap());
    let head = format!("pub struct {name} {{");
    let body = &code[code.find(&head).unwrap() + head.len()..];
    let body = &body[..body.find("\n}").unwrap()];
    body.lines().filter(|l| l.starts_with("    ") && !l.starts_with("     ") && l.contains(": ")).count()
}

/// The hubs a feature is tempted to grow: what they are now, at most. A feature gets a type
/// of its own that they own instead; a bound is lowered as parts move out, and raised only
/// with a reason in the commit. (The goals: `Controller` 400 lines of methods and 25 public
/// ones, `Engine` 20 fields.)
#[test]
fn the_hubs_grow_no_further() {
    let server = workspace().join("crates/server/src");
    let (lines, public) = hub(&server, "Controller");
    assert!(lines <= 311 && public <= 14, "Controller: {lines} lines of methods, {public} public");
    let (lines, public) = hub(&server, "Cluster");
    assert!(lines <= 215 && public <= 11, "Cluster: {lines} lines of methods, {public} public");
    let engine = fields(&workspace().join("crates/core/src/engine/mod.rs"), "Engine");
    assert!(engine <= 16, "Engine: {engine} fields");
}

/// Functions of this many lines or more count as long.
const LONG: usize = 70;
/// How many long functions there may be (tests included), at most: under 30, lowered as they
/// are split, never raised.
const LONG_MAX: usize = 28;

#[test]
fn long_functions_are_few() {
    let mut files = Vec::new();
    sources(&workspace().join("crates"), &mut files);
    let mut long = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for (name, line, len) in functions(&text) {
            if len >= LONG {
                long.push((len, format!("{}:{line} fn {name}: {len} lines", file.display())));
            }
        }
    }
    long.sort();
    let listed: Vec<&str> = long.iter().map(|(_, l)| l.as_str()).collect();
    assert!(
        long.len() <= LONG_MAX,
        "{} functions of {LONG}+ lines (at most {LONG_MAX}):\n{}",
        long.len(),
        listed.join("\n")
    );
}

/// The clock ban (clippy.toml) is lifted in the server's clock seam alone: every other part
/// takes time as an argument or from `clock`.
/// The server's source files, but the one named `except`, whose code (comments and strings
/// left out) holds `needle`.
fn server_files_using(except: &str, needle: &str) -> Vec<String> {
    let mut files = Vec::new();
    sources(&workspace().join("crates/server/src"), &mut files);
    files
        .iter()
        .filter(|f| !f.ends_with(except))
        .filter(|f| code_only(&std::fs::read_to_string(f).unwrap()).contains(needle))
        .map(|f| f.display().to_string())
        .collect()
}

#[test]
fn the_server_reads_a_clock_only_in_its_clock_seam() {
    let readers = server_files_using("clock.rs", "clippy::disallowed_methods");
    assert!(readers.is_empty(), "clocks read outside crates/server/src/clock.rs:\n{}", readers.join("\n"));
}

/// Simulated time steps only once the server's blocking work has run (testkit's `net`), which
/// it knows by the count `blocking::spawn` keeps: work handed to tokio's pool another way
/// would go uncounted.
#[test]
fn the_server_hands_out_blocking_work_only_through_its_counted_seam() {
    let spawners = server_files_using("blocking.rs", "spawn_blocking");
    assert!(
        spawners.is_empty(),
        "spawn_blocking outside crates/server/src/blocking.rs (use tollgate_controller::blocking::spawn):\n{}",
        spawners.join("\n")
    );
}
