//! The fuzz targets' stable twins: the same entry points (`tollgate_cli::fuzzing`) on random
//! inputs under `cargo test`, so that a regression the fuzzers would find fails CI too. The
//! inputs mix raw bytes with pieces of the real formats, to get past the first parser.

use proptest::prelude::*;
use prost::Message;
use tollgate_cli::fuzzing;
use tollgate_proto::v1;

/// Pieces of a settings file or a scenario, good and bad.
fn toml_piece() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("[node]\n".to_string()),
        Just("[cost]\nmodel = \"ru\"\n".to_string()),
        Just("[groups.a]\n".to_string()),
        Just("[groups.default]\n".to_string()),
        Just("[groups.a.ramp]\nmin = 1\nmax = 5\nduration_s = 3\n".to_string()),
        Just("name = \"s\"\n".to_string()),
        Just("[[backend]]\nname = \"b\"\ncapacity = 10\n".to_string()),
        Just("[[client]]\ngroup = \"a\"\nrate = 1\n".to_string()),
        Just("[[phase]]\n[[phase.expect]]\nmetric = \"busy_groups\"\nvalue = 0\n".to_string()),
        Just("[controller]\n".to_string()),
        (
            prop_oneof![
                Just("capacity"),
                Just("mode"),
                Just("reserved"),
                Just("limit"),
                Just("burst"),
                Just("priority"),
                Just("weight"),
                Just("budget"),
                Just("duration_s"),
                Just("cool_down_s"),
                Just("resume_ttl_s"),
                Just("count"),
                Just("rate"),
                Just("tick_ms"),
                Just("realloc_ms"),
            ],
            prop_oneof![
                Just("0".to_string()),
                Just("-1".to_string()),
                Just("1e300".to_string()),
                Just("nan".to_string()),
                Just("inf".to_string()),
                Just("\"unlimited\"".to_string()),
                Just("\"fcfs\"".to_string()),
                Just("18446744073709551615".to_string()),
                any::<i64>().prop_map(|i| i.to_string()),
                any::<f64>().prop_map(|f| format!("{f:?}")),
                "\"[ -~]{0,8}\"",
            ],
        )
            .prop_map(|(k, v)| format!("{k} = {v}\n")),
        "[ -~\n]{0,40}",
    ]
}

fn toml_text() -> impl Strategy<Value = String> {
    prop::collection::vec(toml_piece(), 0..12).prop_map(|pieces| pieces.concat())
}

fn cli_piece() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("server".into()),
        Just("group".into()),
        Just("create".into()),
        Just("alter".into()),
        Just("quota".into()),
        Just("set".into()),
        Just("node".into()),
        Just("capacity".into()),
        Just("mode".into()),
        Just("sim".into()),
        Just("ramp".into()),
        Just("bench".into()),
        Just("--limit".into()),
        Just("--ramp".into()),
        Just("--budget".into()),
        Just("--tick-ms".into()),
        Just("--ru-per-sec".into()),
        Just("--burstable".into()),
        Just("--grpc".into()),
        Just("--timeout-ms".into()),
        Just("min=1,max=2,duration_s=3,mode=go_back_n".into()),
        Just("unlimited".into()),
        Just("18446744073709551615".into()),
        Just("-5".into()),
        Just("1e999".into()),
        "[ -~]{0,12}",
    ]
}

/// An exchange (kind 0) of one group's usage.
fn exchange((group, demand, held, seq): (String, f64, f64, u64)) -> Vec<u8> {
    let usage =
        v1::GroupUsage { group, demand, held, consumed: demand, admitted: seq % 7, ..Default::default() };
    let request = v1::ExchangeRequest {
        client_id: "c".into(),
        sequence: seq % 5,
        groups: vec![usage],
        ..Default::default()
    };
    [vec![0u8], request.encode_to_vec()].concat()
}

/// A group put (kind 2) with a reservation, limit, priority and ramp.
fn put_group((n, r, l, mode, priority): (String, f64, f64, i32, u32)) -> Vec<u8> {
    let ramp = v1::RampSettings { min: r, max: l, duration_s: r, mode, ..Default::default() };
    let patch = v1::GroupPatch {
        reserved: Some(r),
        limit: Some(l),
        priority: Some(priority),
        ramp: Some(ramp),
        ..Default::default()
    };
    [vec![2u8], v1::PutGroupRequest { name: n, patch: Some(patch), mode }.encode_to_vec()].concat()
}

/// Messages that decode, with numbers and names chosen to break rules.
fn message() -> impl Strategy<Value = Vec<u8>> {
    let number =
        prop_oneof![Just(f64::NAN), Just(f64::INFINITY), Just(-1.0), Just(1e300), Just(0.0), 0.0..1e6f64];
    let name = prop_oneof![
        Just(String::new()),
        Just("g".to_string()),
        Just("default".to_string()),
        "[ -~\n]{0,300}"
    ];
    prop_oneof![
        (name.clone(), number.clone(), number.clone(), any::<u64>()).prop_map(exchange),
        (name.clone(), number.clone(), number.clone()).prop_map(|(group, u, load)| {
            let mut bytes = vec![1u8];
            let report = v1::BackendReport {
                backend_id: "b".into(),
                zone: "z".into(),
                health: Some(v1::backend_report::Health::Utilisation(u)),
                loads: vec![v1::GroupLoad { group, units_per_s: load }],
                capacity: None,
            };
            bytes.extend(report.encode_to_vec());
            bytes
        }),
        (name.clone(), number.clone(), number.clone(), any::<i32>(), any::<u32>()).prop_map(put_group),
        number.prop_map(|c| {
            let mut bytes = vec![6u8];
            bytes.extend(v1::SetCapacityRequest { capacity: Some(c) }.encode_to_vec());
            bytes
        }),
        (name.clone(), any::<bool>(), any::<u8>()).prop_map(|(n, if_exists, which)| match which % 3 {
            0 => [vec![3u8], v1::DropGroupRequest { name: n, if_exists }.encode_to_vec()].concat(),
            1 => [vec![4u8], v1::GetGroupRequest { name: n }.encode_to_vec()].concat(),
            _ => [vec![7u8], v1::SetModeRequest { mode: i32::from(which) - 100 }.encode_to_vec()].concat(),
        }),
        (any::<u32>(), name, any::<bool>()).prop_map(|(page_size, page_token, list)| {
            let page_size = page_size % 20_000;
            if list {
                [vec![5u8], v1::ListGroupsRequest { page_size, page_token }.encode_to_vec()].concat()
            } else {
                [vec![9u8], v1::StatusRequest { page_size, page_token }.encode_to_vec()].concat()
            }
        }),
        Just(vec![8u8]),
        Just(vec![10u8]),
        prop::collection::vec(any::<u8>(), 0..200),
    ]
}

/// Pieces of the texts operators type: SQL keywords, numbers, names, punctuation.
fn sql_piece() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "CREATE",
            "ALTER",
            "DROP",
            "SHOW",
            "RESOURCE",
            "GROUP",
            "GROUPS",
            "IF",
            "NOT",
            "EXISTS",
            "RU_PER_SEC",
            "PRIORITY",
            "BURSTABLE",
            "LOW",
            "HIGH",
            "TRUE",
            "FALSE",
            "=",
            ",",
            ";",
            "/*",
            "*/",
            "--",
            "'",
            "`",
            "\n",
            "1e15",
            "1e16",
            "-1",
            "NaN",
            "inf",
            "0",
            "16",
            "17",
        ])
        .prop_map(String::from),
        "[a-z_]{1,8}",
        any::<f64>().prop_map(|f| f.to_string()),
        ".{0,6}",
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn settings_files(text in toml_text(), bytes in prop::collection::vec(any::<u8>(), 0..100)) {
        fuzzing::settings_file(text.as_bytes());
        fuzzing::settings_file(&bytes);
    }

    #[test]
    fn scenarios(text in toml_text()) {
        fuzzing::scenario(text.as_bytes());
    }

    #[test]
    fn command_lines(args in prop::collection::vec(cli_piece(), 0..8)) {
        fuzzing::cli_args(args.join("\0").as_bytes());
    }

    #[test]
    fn admin_texts(which in 0u8..8, pieces in prop::collection::vec(sql_piece(), 0..24), bytes in prop::collection::vec(any::<u8>(), 0..100)) {
        let mut text = vec![which];
        text.extend(pieces.join(" ").as_bytes());
        fuzzing::admin_text(&text);
        fuzzing::admin_text(&bytes);
    }

    #[test]
    fn grpc_messages(messages in prop::collection::vec(message(), 1..20)) {
        for m in messages {
            fuzzing::grpc_message(&m);
        }
    }
}
