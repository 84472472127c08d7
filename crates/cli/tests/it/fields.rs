//! Every group setting declared once (`tollgate_model::fields`), and each layer a setting
//! passes through checked against the declaration: the settings file, the protocol's
//! messages, the HTTP body and its OpenAPI schema (ranges included), the `tollgate group`
//! flags, and the Python client's table. A setting one layer lacks, or a range it states
//! otherwise, fails here with the layer named.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use serde_json::Value;
use tollgate_model::config::Config;
use tollgate_model::fields::{GROUP_FIELDS, Kind, python_table};

use crate::common::{self, ServerProc, data_dir};

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A value past the setting's range, as TOML and JSON write it.
fn past_the_range(kind: Kind, max: f64) -> String {
    match kind {
        Kind::Whole => format!("{}", max as u64 + 1),
        _ => format!("{:e}", max * 2.0 + 1.0).replace("e", "e+").replace("e+-", "e-"),
    }
}

#[test]
fn the_settings_file_takes_every_setting_in_its_range_and_refuses_past_it() {
    assert_eq!(
        tollgate_model::fields::names(),
        tollgate_model::toml_reader::GROUP_KEYS,
        "the settings file's keys"
    );
    for f in GROUP_FIELDS {
        let good = format!("[groups.p]\n[groups.g]\n{} = {}\n", f.name, f.example);
        if let Err(e) = Config::parse(&good) {
            panic!("settings file: {} = {} refused: {e}", f.name, f.example);
        }
        if let Some(r) = f.range {
            let bad = format!("[groups.g]\n{} = {}\n", f.name, past_the_range(f.kind, r.max));
            let e = Config::parse(&bad).err().unwrap_or_else(|| panic!("settings file took {bad:?}"));
            assert!(e.to_string().contains(&format!("groups.g.{}", f.name)), "{bad:?}: {e}");
        }
    }
}

#[test]
fn the_protocol_carries_every_setting_in_the_settings_and_the_patch() {
    let proto =
        std::fs::read_to_string(workspace().join("crates/proto/proto/tollgate/v1/tollgate.proto")).unwrap();
    for message in ["GroupSettings", "GroupPatch"] {
        let head = format!("message {message} {{");
        let body = &proto[proto.find(&head).unwrap()..];
        let body = &body[..body.find("\n}").unwrap()];
        for f in GROUP_FIELDS {
            assert!(
                body.lines().any(|l| l.split_whitespace().any(|w| w == f.proto) && l.contains(" = ")),
                "protocol: {message} has no field {}",
                f.proto
            );
        }
    }
}

#[test]
fn the_group_command_has_a_flag_for_every_setting() {
    for command in ["create", "alter"] {
        let out =
            Command::new(env!("CARGO_BIN_EXE_tollgate")).args(["group", command, "--help"]).output().unwrap();
        let help = String::from_utf8_lossy(&out.stdout);
        for f in GROUP_FIELDS {
            let flag = format!("--{} ", f.flag.replace('_', "-"));
            assert!(help.contains(&flag), "tollgate group {command}: no {flag}for {}", f.name);
        }
    }
}

#[test]
fn the_python_table_is_the_declarations() {
    let path = workspace().join("clients/python/tollgate/_fields.py");
    let made = python_table();
    if std::env::var_os("TOLLGATE_BLESS").is_some() {
        std::fs::write(&path, &made).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(committed == made, "{} is not current: run this test with TOLLGATE_BLESS=1", path.display());
}

/// One request: the status and the body as JSON.
fn call(addr: &str, method: &str, path: &str, body: &str) -> (u16, Value) {
    let (code, _, body) = common::http(addr, method, path, &[], body);
    (code, serde_json::from_str(&body).unwrap_or(Value::Null))
}

#[test]
fn the_http_body_and_its_schema_take_every_setting_within_the_declared_range() {
    let s = ServerProc::start_with(&data_dir("fields"), &[], Stdio::null());
    let h = s.http.as_str();
    let (code, doc) = call(h, "GET", "/v1/openapi.json", "");
    assert_eq!(code, 200);
    let schemas = &doc["components"]["schemas"];
    assert_eq!(call(h, "PUT", "/v1/groups/p", "{}").0, 201);
    for f in GROUP_FIELDS {
        for schema in ["GroupBody", "GroupSettings"] {
            let p = &schemas[schema]["properties"][f.name];
            assert!(p.is_object(), "OpenAPI: {schema} has no {}", f.name);
        }
        let p = &schemas["GroupBody"]["properties"][f.name];
        if let Some(r) = f.range.filter(|_| p.get("maximum").is_some() || p.get("minimum").is_some()) {
            let low = if r.above_min { "exclusiveMinimum" } else { "minimum" };
            assert_eq!(p[low].as_f64(), Some(r.min), "OpenAPI: GroupBody.{}'s {low}", f.name);
            assert_eq!(p["maximum"].as_f64(), Some(r.max), "OpenAPI: GroupBody.{}'s maximum", f.name);
        } else if matches!(f.kind, Kind::Number) && f.name != "limit" {
            panic!("OpenAPI: GroupBody.{} states no range", f.name);
        }
        if let Some(r) = f.range {
            let body = format!("{{\"{}\": {}}}", f.name, past_the_range(f.kind, r.max));
            let (code, v) = call(h, "PUT", "/v1/groups/g", &body);
            assert_eq!(code, 400, "HTTP took {body}: {v}");
            assert!(v.to_string().contains(f.name), "HTTP: {body} refused without naming it: {v}");
        }
    }
}
