//! The hand-written exchange and backend report held to the generated code: the same messages
//! accepted, the same values read, the same bytes written.

use proptest::prelude::*;
use prost::Message;

use super::*;

/// Values compared by their bits (NaN equals NaN, -0.0 differs from 0.0), through `Debug`.
fn same<T: std::fmt::Debug>(a: &T, b: &T) -> bool {
    format!("{a:?}") == format!("{b:?}")
}

fn any_f64() -> impl Strategy<Value = f64> {
    prop_oneof![
        Just(0.0),
        Just(-0.0),
        Just(f64::NAN),
        Just(f64::INFINITY),
        Just(f64::NEG_INFINITY),
        any::<f64>(),
        0.0..1e6,
    ]
}

fn any_name() -> impl Strategy<Value = String> {
    prop_oneof![Just(String::new()), "[a-z0-9-]{1,30}", any::<String>(), "[a-z]{200,300}"]
}

fn any_detail() -> impl Strategy<Value = Option<v1::Consumption>> {
    proptest::option::of(proptest::array::uniform7(any_f64()).prop_map(|v| v1::Consumption {
        rru: v[0],
        wru: v[1],
        read_bytes: v[2],
        write_bytes: v[3],
        cpu_ms: v[4],
        read_rpcs: v[5],
        write_rpcs: v[6],
    }))
}

fn any_usage() -> impl Strategy<Value = v1::GroupUsage> {
    (
        any_name(),
        proptest::array::uniform6(any_f64()),
        proptest::array::uniform4(prop_oneof![Just(0u64), any::<u64>(), 0u64..300]),
        any_detail(),
        any::<[u32; 2]>(),
        proptest::array::uniform4(prop_oneof![Just(0u64), any::<u64>()]),
        proptest::option::of((prop_oneof![Just(0u64), any::<u64>()], any_f64(), any_f64(), any::<u32>())),
    )
        .prop_map(|(group, f, n, detail, slots, c, quota)| v1::GroupUsage {
            group,
            demand: f[0],
            consumed: f[1],
            admitted: n[0],
            throttled: n[1],
            waiting: f[2],
            unthrottled: f[3],
            held: f[4],
            largest: f[5],
            waited: n[2],
            would_refuse: n[3],
            in_flight: slots[0],
            in_flight_asked: slots[1],
            critical_admitted: c[0],
            critical_throttled: c[1],
            sheddable_admitted: c[2],
            sheddable_throttled: c[3],
            detail,
            quota: quota.map(|(window, given, used, lasts_ms)| v1::QuotaHeld {
                window,
                given,
                used,
                lasts_ms,
            }),
        })
}

fn any_request() -> impl Strategy<Value = v1::ExchangeRequest> {
    (
        any_name(),
        any::<u64>(),
        proptest::collection::vec(any_usage(), 0..20),
        any::<u32>(),
        proptest::option::of(prop_oneof![Just(0u64), any::<u64>()]),
        any::<bool>(),
    )
        .prop_map(
            |(client_id, sequence, groups, target_request_period_ms, shard_map_epoch, takes_allotments)| {
                v1::ExchangeRequest {
                    client_id,
                    sequence,
                    groups,
                    target_request_period_ms,
                    shard_map_epoch,
                    takes_allotments,
                }
            },
        )
}

/// A field of arbitrary shape: a known or unknown number, any wire type (wrong ones too), any
/// payload, nested fields, groups whose end matches or not.
#[derive(Debug, Clone)]
enum Field {
    Varint(u32, u64),
    Fixed64(u32, u64),
    Fixed32(u32, u32),
    Bytes(u32, Vec<u8>),
    Nested(u32, Vec<Field>),
    Group(u32, Vec<Field>, u32),
    Raw(Vec<u8>),
}

fn any_field() -> impl Strategy<Value = Field> {
    let tag = prop_oneof![1u32..=12, Just(0u32), Just(1 << 28), 13u32..2000];
    let leaf = prop_oneof![
        (tag.clone(), prop_oneof![any::<u64>(), 0u64..3]).prop_map(|(t, v)| Field::Varint(t, v)),
        (tag.clone(), any::<u64>()).prop_map(|(t, v)| Field::Fixed64(t, v)),
        (tag.clone(), any::<u32>()).prop_map(|(t, v)| Field::Fixed32(t, v)),
        (
            tag.clone(),
            prop_oneof![
                proptest::collection::vec(any::<u8>(), 0..12),
                "[a-z]{0,8}".prop_map(String::into_bytes)
            ]
        )
            .prop_map(|(t, v)| Field::Bytes(t, v)),
        proptest::collection::vec(any::<u8>(), 0..4).prop_map(Field::Raw),
    ];
    leaf.prop_recursive(4, 40, 6, move |inner| {
        let tag = prop_oneof![1u32..=12, 13u32..40];
        prop_oneof![
            (tag.clone(), proptest::collection::vec(inner.clone(), 0..6))
                .prop_map(|(t, f)| Field::Nested(t, f)),
            (tag.clone(), proptest::collection::vec(inner, 0..4), prop_oneof![Just(0u32), 1u32..40])
                .prop_map(|(t, f, end)| Field::Group(t, f, end)),
        ]
    })
}

/// A field of the right wire type for its number in a `GroupUsage` (numbers past 19 are
/// unknown ones), repeated and in any order: what other encoders may send.
fn usage_field() -> impl Strategy<Value = Field> {
    let detail = proptest::collection::vec(
        prop_oneof![
            (1u32..=8, any::<u64>()).prop_map(|(t, v)| Field::Fixed64(t, v)),
            (8u32..12, any::<u64>()).prop_map(|(t, v)| Field::Varint(t, v)),
        ],
        0..9,
    );
    // The allotment held: its window, then given and used, how long it should last, and
    // unknown fields.
    let quota = proptest::collection::vec(
        prop_oneof![
            any::<u64>().prop_map(|v| Field::Varint(1, v)),
            (2u32..=3, any::<u64>()).prop_map(|(t, v)| Field::Fixed64(t, v)),
            (4u32..12, any::<u64>()).prop_map(|(t, v)| Field::Varint(t, v)),
        ],
        0..6,
    );
    prop_oneof![
        "[a-z]{0,6}".prop_map(|s| Field::Bytes(1, s.into_bytes())),
        (prop_oneof![Just(2u32), Just(3), Just(6), Just(7), Just(8), Just(19)], any::<u64>())
            .prop_map(|(t, v)| Field::Fixed64(t, v)),
        (prop_oneof![Just(4u32), Just(5), Just(9), Just(11), 12u32..=17], any::<u64>())
            .prop_map(|(t, v)| Field::Varint(t, v)),
        detail.prop_map(|f| Field::Nested(10, f)),
        quota.prop_map(|f| Field::Nested(18, f)),
        (20u32..30, any::<u32>()).prop_map(|(t, v)| Field::Fixed32(t, v)),
        (20u32..30, any::<u64>()).prop_map(|(t, v)| Field::Varint(t, v)),
    ]
}

/// A request's fields of the right wire types, repeated, in any order, unknown ones among them.
fn request_fields() -> impl Strategy<Value = Vec<Field>> {
    proptest::collection::vec(
        prop_oneof![
            "[a-z]{0,6}".prop_map(|s| Field::Bytes(1, s.into_bytes())),
            (prop_oneof![Just(2u32), Just(4), Just(5), Just(6)], any::<u64>())
                .prop_map(|(t, v)| Field::Varint(t, v)),
            proptest::collection::vec(usage_field(), 0..12).prop_map(|f| Field::Nested(3, f)),
            (7u32..40, proptest::collection::vec(any::<u8>(), 0..5)).prop_map(|(t, v)| Field::Bytes(t, v)),
        ],
        0..10,
    )
}

fn put_varint(out: &mut Vec<u8>, v: u64) {
    prost::encoding::encode_varint(v, out);
}

fn put_key(out: &mut Vec<u8>, tag: u32, wire: u64) {
    put_varint(out, (u64::from(tag) << 3) | wire);
}

fn encode_fields(fields: &[Field], out: &mut Vec<u8>) {
    for f in fields {
        match f {
            Field::Varint(t, v) => {
                put_key(out, *t, 0);
                put_varint(out, *v);
            }
            Field::Fixed64(t, v) => {
                put_key(out, *t, 1);
                out.extend_from_slice(&v.to_le_bytes());
            }
            Field::Fixed32(t, v) => {
                put_key(out, *t, 5);
                out.extend_from_slice(&v.to_le_bytes());
            }
            Field::Bytes(t, v) => {
                put_key(out, *t, 2);
                put_varint(out, v.len() as u64);
                out.extend_from_slice(v);
            }
            Field::Nested(t, inner) => {
                let mut body = Vec::new();
                encode_fields(inner, &mut body);
                put_key(out, *t, 2);
                put_varint(out, body.len() as u64);
                out.extend_from_slice(&body);
            }
            Field::Group(t, inner, end) => {
                put_key(out, *t, 3);
                encode_fields(inner, out);
                put_key(out, if *end == 0 { *t } else { *end }, 4);
            }
            Field::Raw(bytes) => out.extend_from_slice(bytes),
        }
    }
}

fn any_report() -> impl Strategy<Value = v1::BackendReport> {
    let health = proptest::option::of(prop_oneof![
        any_f64().prop_map(v1::backend_report::Health::QueueBytes),
        any_f64().prop_map(v1::backend_report::Health::Utilisation),
    ]);
    let load = (any_name(), any_f64()).prop_map(|(group, units_per_s)| v1::GroupLoad { group, units_per_s });
    (any_name(), any_name(), health, proptest::collection::vec(load, 0..30), proptest::option::of(any_f64()))
        .prop_map(|(backend_id, zone, health, loads, capacity)| v1::BackendReport {
            backend_id,
            zone,
            health,
            loads,
            capacity,
        })
}

/// A report's fields in any order, repeated, with unknown ones and the two healths both sent.
fn report_fields() -> impl Strategy<Value = Vec<Field>> {
    let load = prop_oneof![
        "[a-z]{0,6}".prop_map(|s| Field::Bytes(1, s.into_bytes())),
        any::<u64>().prop_map(|v| Field::Fixed64(2, v)),
        (3u32..40, any::<u64>()).prop_map(|(t, v)| Field::Varint(t, v)),
    ];
    proptest::collection::vec(
        prop_oneof![
            (prop_oneof![Just(1u32), Just(2)], "[a-z]{0,6}")
                .prop_map(|(t, s)| Field::Bytes(t, s.into_bytes())),
            (prop_oneof![Just(3u32), Just(4), Just(6)], any::<u64>()).prop_map(|(t, v)| Field::Fixed64(t, v)),
            proptest::collection::vec(load, 0..5).prop_map(|f| Field::Nested(5, f)),
            (7u32..40, proptest::collection::vec(any::<u8>(), 0..5)).prop_map(|(t, v)| Field::Bytes(t, v)),
        ],
        0..12,
    )
}

/// Both readings of `bytes` as a backend report agree: both refuse it, or both read the same
/// values.
fn agree_report(bytes: &[u8]) -> Result<(), TestCaseError> {
    let generated = v1::BackendReport::decode(bytes);
    let by_hand = ReportView::decode(bytes);
    match (&generated, &by_hand) {
        (Ok(m), Ok(v)) => prop_assert!(same(&ReportView::of(m), v), "{:?}\n{:?}", ReportView::of(m), v),
        (Err(_), Err(_)) => {}
        _ => prop_assert!(false, "generated {generated:?}, by hand {by_hand:?}, bytes {bytes:?}"),
    }
    Ok(())
}

/// Edits `bytes` at random places: each edit overwrites, inserts or removes a byte, or cuts
/// the rest off.
fn damage(bytes: &mut Vec<u8>, edits: Vec<(prop::sample::Index, u8, u8)>) {
    for (at, byte, how) in edits {
        if bytes.is_empty() {
            bytes.push(byte);
            continue;
        }
        let i = at.index(bytes.len());
        match how {
            0 => bytes[i] = byte,
            1 => bytes.insert(i, byte),
            2 => {
                bytes.remove(i);
            }
            _ => bytes.truncate(i),
        }
    }
}

/// Both readings of `bytes` agree: both refuse it, or both read the same values.
fn agree(bytes: &[u8]) -> Result<(), TestCaseError> {
    let generated = v1::ExchangeRequest::decode(bytes);
    let by_hand = ExchangeView::decode(bytes);
    match (&generated, &by_hand) {
        (Ok(m), Ok(v)) => prop_assert!(same(&ExchangeView::of(m), v), "{:?}\n{:?}", ExchangeView::of(m), v),
        (Err(_), Err(_)) => {}
        _ => prop_assert!(false, "generated {generated:?}, by hand {by_hand:?}, bytes {bytes:?}"),
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn any_request_reads_as_the_generated_code_reads_it(m in any_request()) {
        // Compared with what the generated code reads back: it leaves out a -0.0, as a zero.
        let bytes = m.encode_to_vec();
        let v = ExchangeView::decode(&bytes).unwrap();
        prop_assert!(same(&v, &ExchangeView::of(&v1::ExchangeRequest::decode(bytes.as_slice()).unwrap())));
    }

    #[test]
    fn any_fields_are_accepted_or_refused_as_the_generated_code_does(
        fields in proptest::collection::vec(any_field(), 0..12),
    ) {
        let mut bytes = Vec::new();
        encode_fields(&fields, &mut bytes);
        agree(&bytes)?;
    }

    #[test]
    fn fields_in_any_order_repeated_or_unknown_read_as_the_generated_code_reads_them(
        fields in request_fields(),
    ) {
        let mut bytes = Vec::new();
        encode_fields(&fields, &mut bytes);
        prop_assert!(ExchangeView::decode(&bytes).is_ok());
        agree(&bytes)?;
    }

    #[test]
    fn a_request_damaged_anywhere_is_accepted_or_refused_as_the_generated_code_does(
        m in any_request(),
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..4), 1..4),
    ) {
        let mut bytes = m.encode_to_vec();
        damage(&mut bytes, edits);
        agree(&bytes)?;
    }

    #[test]
    fn any_report_reads_as_the_generated_code_reads_it(m in any_report()) {
        let bytes = m.encode_to_vec();
        let v = ReportView::decode(&bytes).unwrap();
        prop_assert!(same(&v, &ReportView::of(&v1::BackendReport::decode(bytes.as_slice()).unwrap())));
    }

    #[test]
    fn any_fields_are_accepted_or_refused_as_a_report_as_the_generated_code_does(
        fields in proptest::collection::vec(any_field(), 0..12),
    ) {
        let mut bytes = Vec::new();
        encode_fields(&fields, &mut bytes);
        agree_report(&bytes)?;
    }

    #[test]
    fn report_fields_in_any_order_repeated_or_unknown_read_as_the_generated_code_reads_them(
        fields in report_fields(),
    ) {
        let mut bytes = Vec::new();
        encode_fields(&fields, &mut bytes);
        prop_assert!(ReportView::decode(&bytes).is_ok());
        agree_report(&bytes)?;
    }

    #[test]
    fn a_report_damaged_anywhere_is_accepted_or_refused_as_the_generated_code_does(
        m in any_report(),
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..4), 1..4),
    ) {
        let mut bytes = m.encode_to_vec();
        damage(&mut bytes, edits);
        agree_report(&bytes)?;
    }

    #[test]
    fn an_answer_is_written_byte_for_byte_as_the_generated_code_writes_it(
        grants in proptest::collection::vec(
            (any_name(), any::<[bool; 3]>(), proptest::array::uniform4(any_f64()),
             proptest::array::uniform4(prop_oneof![Just(0u32), any::<u32>(), 1u32..200])),
            0..20,
        ),
        slots in proptest::collection::vec(proptest::option::of(prop_oneof![Just(0u32), any::<u32>()]), 20),
        shards in proptest::collection::vec(proptest::option::of(prop_oneof![Just(0u32), 0u32..4096, any::<u32>()]), 20),
        quotas in proptest::collection::vec(proptest::option::of((any::<u64>(), any_f64(), proptest::option::of(0u64..10_000_000_000), any_f64(), proptest::option::of(prop_oneof![Just(0u64), any::<u64>()]))), 20),
        next in any::<[u32; 2]>(),
        allowed in any::<bool>(),
        map in proptest::option::of((any::<u64>(), proptest::collection::vec(any_name(), 0..4), proptest::collection::vec(0u32..5, 1..40))),
    ) {
        let mut writer = AnswerWriter::with_capacity(grants.len());
        let mut expected = v1::ExchangeResponse {
            grants: Vec::new(),
            next_exchange_ms: next[0],
            next_tick_ms: next[1],
            unthrottled_allowed: allowed,
            shard_map: map.map(|(epoch, members, owners)| v1::ShardMap {
                epoch,
                shards: owners.len() as u32,
                members,
                owners,
            }),
        };
        for ((((group, flags, f, n), in_flight), shard), quota) in grants.into_iter().zip(slots).zip(shards).zip(quotas) {
            // As an engine hands it out (a window's end in whole milliseconds, at least one).
            let quota = quota.map(|(window, add, ends_ms, left, reset_ms)| tollgate_model::engine::Allotment {
                window,
                add,
                ends_in: ends_ms.map(|ms| std::time::Duration::from_millis(ms.max(1))),
                left,
                reset_in: reset_ms.map(std::time::Duration::from_millis),
            });
            let fields = GrantFields {
                unlimited: flags[0],
                rate: f[0],
                burst: f[1],
                lease_ms: n[0],
                reserved: f[2],
                clients: n[1],
                count_dropped: flags[1],
                debt_repay_ms: n[2],
                trickle_ms: n[3],
                shadow: flags[2],
                critical_reserve: f[3],
                in_flight,
                quota,
            };
            writer.grant_in_shard(&group, &fields, shard);
            expected.grants.push(v1::Grant { shard, ..fields.grant(group) });
        }
        let written = writer.finish_with_map(next[0], next[1], allowed, expected.shard_map.as_ref());
        prop_assert_eq!(written, expected.encode_to_vec());
    }
}

#[test]
fn nesting_is_refused_past_the_generated_codes_limit_and_read_below_it() {
    // An unknown field holding groups nested `depth` deep, inside a message of field `field`
    // (an exchange's group usage, 3; a report's load, 5) whose field 1 is its group's name.
    let nested = |field: u32, depth: u32| {
        let mut inner = Vec::new();
        for _ in 0..depth {
            put_key(&mut inner, 20, 3);
        }
        for _ in 0..depth {
            put_key(&mut inner, 20, 4);
        }
        let mut usage = Vec::new();
        put_key(&mut usage, 1, 2);
        put_varint(&mut usage, 1);
        usage.push(b'g');
        usage.extend_from_slice(&inner);
        let mut bytes = Vec::new();
        put_key(&mut bytes, field, 2);
        put_varint(&mut bytes, usage.len() as u64);
        bytes.extend_from_slice(&usage);
        bytes
    };
    for depth in [1, 50, 97, 98, 99, 100, 101, 150] {
        let bytes = nested(3, depth);
        let generated = v1::ExchangeRequest::decode(bytes.as_slice()).is_ok();
        assert_eq!(ExchangeView::decode(&bytes).is_ok(), generated, "an exchange {depth} deep");
        let bytes = nested(5, depth);
        let generated = v1::BackendReport::decode(bytes.as_slice()).is_ok();
        assert_eq!(ReportView::decode(&bytes).is_ok(), generated, "a report {depth} deep");
    }
    assert!(ExchangeView::decode(&nested(3, 50)).is_ok());
    assert!(ExchangeView::decode(&nested(3, 150)).is_err());
    assert!(ReportView::decode(&nested(5, 50)).is_ok());
    assert!(ReportView::decode(&nested(5, 150)).is_err());
}

#[test]
fn varints_of_ten_bytes_hold_64_bits_and_no_more() {
    for (bytes, ok) in [
        (vec![0x10, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01], true),
        (vec![0x10, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02], false),
        (vec![0x10, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x00], false),
        (vec![0x10, 0x80], false),
    ] {
        assert_eq!(ExchangeView::decode(&bytes).is_ok(), ok, "{bytes:?}");
        assert_eq!(v1::ExchangeRequest::decode(bytes.as_slice()).is_ok(), ok, "{bytes:?}");
    }
    assert_eq!(
        ExchangeView::decode(&[0x10, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01])
            .unwrap()
            .sequence,
        u64::MAX
    );
}
