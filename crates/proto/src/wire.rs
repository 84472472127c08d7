//! The exchange read and written by hand, beside the generated code; and a backend's report
//! read by hand.
//!
//! An exchange is the controller's busiest call: every client makes one per tick, carrying up
//! to [`EXCHANGE_GROUPS_MAX`](crate::EXCHANGE_GROUPS_MAX) groups. Through the generated types,
//! each group's name is an allocation, the list of groups grows by copies, and each field of an
//! answer is a call into tonic's output buffer: together, a quarter of the controller's CPU.
//! Here a request is read in place, its names borrowed from the message, and an answer is
//! written into one buffer sized for it.
//!
//! The bytes are the contract's. [`ExchangeView::decode`] accepts exactly the messages the
//! generated code accepts (the same checks on keys, wire types, lengths, UTF-8 and nesting,
//! unknown fields skipped, the last of a repeated scalar kept) and reads the same values;
//! [`AnswerWriter`] writes byte for byte what the generated code writes; [`ReportView::decode`]
//! reads a backend's report (up to 10,000 loads) the same way. The tests hold them to the
//! generated code for any message and any bytes.

use crate::v1;

/// Why a message could not be read: the generated code refuses the same messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeError(&'static str);

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for DecodeError {}

/// Nested messages and groups read at most this deep (the generated code's limit).
const NESTING_MAX: u32 = 100;

/// One group's usage, read from a request in place.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct UsageView<'a> {
    /// The group's name, as sent (checked by [`crate::check`]).
    pub group: &'a str,
    /// Units/s asked for.
    pub demand: f64,
    /// Units consumed since the last exchange.
    pub consumed: f64,
    /// Requests admitted since the last exchange.
    pub admitted: u64,
    /// Requests refused since the last exchange.
    pub throttled: u64,
    /// Units waiting for admission now.
    pub waiting: f64,
    /// Units/s of unthrottled work.
    pub unthrottled: f64,
    /// The rate of the grant the client holds.
    pub held: f64,
    /// Requests admitted after waiting.
    pub waited: u64,
    /// The detailed consumption, in the contract's field order (`rru` to `write_rpcs`);
    /// `None` when absent.
    pub detail: Option<[f64; 7]>,
    /// Requests admitted in shadow mode that would have been refused.
    pub would_refuse: u64,
    /// Requests held in flight now.
    pub in_flight: u32,
    /// The most requests held or tried at once since the last exchange.
    pub in_flight_asked: u32,
    /// Critical and sheddable requests admitted and refused since the last exchange.
    pub classes: [[u64; 2]; 2],
    /// The quota allotment the client holds, if it sent one.
    pub quota: Option<tollgate_model::engine::QuotaHeld>,
    /// The cost of the largest single request admitted since the last exchange (0: none told).
    pub largest: f64,
}

/// An exchange request, read in place.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ExchangeView<'a> {
    /// The client's id.
    pub client_id: &'a str,
    /// The client's exchange number.
    pub sequence: u64,
    /// The groups reported, in the request's order.
    pub groups: Vec<UsageView<'a>>,
    /// The exchange period asked for, in milliseconds.
    pub target_request_period_ms: u32,
    /// The epoch of the shard map the client holds, when it follows one.
    pub shard_map_epoch: Option<u64>,
    /// Whether the client takes quota allotments.
    pub takes_allotments: bool,
}

impl<'a> ExchangeView<'a> {
    /// Reads an encoded `ExchangeRequest`.
    pub fn decode(bytes: &'a [u8]) -> Result<Self, DecodeError> {
        let mut r = Reader { buf: bytes };
        let mut view = ExchangeView::default();
        while !r.buf.is_empty() {
            let (tag, wire) = r.key()?;
            match tag {
                1 => view.client_id = r.string(wire)?,
                2 => view.sequence = r.uint(wire)?,
                3 => {
                    let mut inner = r.message(wire, NESTING_MAX)?;
                    view.groups.push(inner.usage(NESTING_MAX - 1)?);
                }
                4 => view.target_request_period_ms = r.uint(wire)? as u32,
                5 => view.shard_map_epoch = Some(r.uint(wire)?),
                // Proto3 reads a bool as any varint other than 0.
                6 => view.takes_allotments = r.uint(wire)? != 0,
                _ => r.skip(wire, tag, NESTING_MAX)?,
            }
        }
        Ok(view)
    }

    /// The same view of a request already decoded by the generated code.
    pub fn of(m: &'a v1::ExchangeRequest) -> Self {
        let usage = |g: &'a v1::GroupUsage| UsageView {
            group: &g.group,
            demand: g.demand,
            consumed: g.consumed,
            admitted: g.admitted,
            throttled: g.throttled,
            waiting: g.waiting,
            unthrottled: g.unthrottled,
            held: g.held,
            waited: g.waited,
            would_refuse: g.would_refuse,
            largest: g.largest,
            in_flight: g.in_flight,
            in_flight_asked: g.in_flight_asked,
            classes: [
                [g.critical_admitted, g.critical_throttled],
                [g.sheddable_admitted, g.sheddable_throttled],
            ],
            detail: g
                .detail
                .as_ref()
                .map(|d| [d.rru, d.wru, d.read_bytes, d.write_bytes, d.cpu_ms, d.read_rpcs, d.write_rpcs]),
            quota: g.quota.as_ref().map(|q| tollgate_model::engine::QuotaHeld {
                window: q.window,
                given: q.given,
                used: q.used,
                lasts: (q.lasts_ms > 0).then(|| std::time::Duration::from_millis(u64::from(q.lasts_ms))),
            }),
        };
        ExchangeView {
            client_id: &m.client_id,
            sequence: m.sequence,
            groups: m.groups.iter().map(usage).collect(),
            target_request_period_ms: m.target_request_period_ms,
            shard_map_epoch: m.shard_map_epoch,
            takes_allotments: m.takes_allotments,
        }
    }
}

/// One group's load in a backend's report, read in place.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct LoadView<'a> {
    /// The group's name, as sent (checked by [`crate::check`]).
    pub group: &'a str,
    /// The load it puts on the backend, units/s.
    pub units_per_s: f64,
}

/// A backend's report, read in place: a report carries up to
/// [`REPORT_GROUPS_MAX`](crate::REPORT_GROUPS_MAX) loads, and through the generated types
/// each of their names is an allocation.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ReportView<'a> {
    /// The backend.
    pub backend_id: &'a str,
    /// Its zone.
    pub zone: &'a str,
    /// Its health, if given (of the two, the last sent).
    pub health: Option<v1::backend_report::Health>,
    /// The loads, in the report's order.
    pub loads: Vec<LoadView<'a>>,
    /// The backend's capacity, units/s, if given.
    pub capacity: Option<f64>,
}

impl<'a> ReportView<'a> {
    /// Reads an encoded `BackendReport`: the messages the generated code accepts, and the
    /// values it reads.
    pub fn decode(bytes: &'a [u8]) -> Result<Self, DecodeError> {
        let mut r = Reader { buf: bytes };
        let mut view = ReportView::default();
        while !r.buf.is_empty() {
            let (tag, wire) = r.key()?;
            match tag {
                1 => view.backend_id = r.string(wire)?,
                2 => view.zone = r.string(wire)?,
                3 => view.health = Some(v1::backend_report::Health::QueueBytes(r.double(wire)?)),
                4 => view.health = Some(v1::backend_report::Health::Utilisation(r.double(wire)?)),
                5 => {
                    let mut inner = r.message(wire, NESTING_MAX)?;
                    let mut load = LoadView::default();
                    while !inner.buf.is_empty() {
                        let (tag, wire) = inner.key()?;
                        match tag {
                            1 => load.group = inner.string(wire)?,
                            2 => load.units_per_s = inner.double(wire)?,
                            _ => inner.skip(wire, tag, NESTING_MAX - 1)?,
                        }
                    }
                    view.loads.push(load);
                }
                6 => view.capacity = Some(r.double(wire)?),
                _ => r.skip(wire, tag, NESTING_MAX)?,
            }
        }
        Ok(view)
    }

    /// The same view of a report already decoded by the generated code.
    pub fn of(m: &'a v1::BackendReport) -> Self {
        ReportView {
            backend_id: &m.backend_id,
            zone: &m.zone,
            health: m.health,
            loads: m.loads.iter().map(|l| LoadView { group: &l.group, units_per_s: l.units_per_s }).collect(),
            capacity: m.capacity,
        }
    }
}

/// Protocol buffers' wire types.
const VARINT: u8 = 0;
const FIXED64: u8 = 1;
const DELIMITED: u8 = 2;
const START_GROUP: u8 = 3;
const END_GROUP: u8 = 4;
const FIXED32: u8 = 5;

/// What is left of a message to read.
struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    #[inline]
    fn varint(&mut self) -> Result<u64, DecodeError> {
        let mut value = 0u64;
        for (i, &byte) in self.buf.iter().take(10).enumerate() {
            value |= u64::from(byte & 0x7f) << (7 * i);
            if byte < 0x80 {
                // A tenth byte may carry one bit only: more would overflow 64 bits.
                if i == 9 && byte > 1 {
                    break;
                }
                self.buf = &self.buf[i + 1..];
                return Ok(value);
            }
        }
        Err(DecodeError("invalid varint"))
    }

    /// A field's number and wire type.
    #[inline]
    fn key(&mut self) -> Result<(u32, u8), DecodeError> {
        let key = self.varint()?;
        let key = u32::try_from(key).map_err(|_| DecodeError("invalid key value"))?;
        let wire = (key & 7) as u8;
        if wire > FIXED32 {
            return Err(DecodeError("invalid wire type value"));
        }
        let tag = key >> 3;
        if tag == 0 {
            return Err(DecodeError("invalid tag value: 0"));
        }
        Ok((tag, wire))
    }

    #[inline]
    fn expect(wire: u8, expected: u8) -> Result<(), DecodeError> {
        if wire == expected { Ok(()) } else { Err(DecodeError("invalid wire type")) }
    }

    #[inline]
    fn take(&mut self, n: u64) -> Result<&'a [u8], DecodeError> {
        let n = usize::try_from(n)
            .ok()
            .filter(|&n| n <= self.buf.len())
            .ok_or(DecodeError("buffer underflow"))?;
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    #[inline]
    fn uint(&mut self, wire: u8) -> Result<u64, DecodeError> {
        Self::expect(wire, VARINT)?;
        self.varint()
    }

    #[inline]
    fn double(&mut self, wire: u8) -> Result<f64, DecodeError> {
        Self::expect(wire, FIXED64)?;
        let bytes = self.take(8)?;
        Ok(f64::from_le_bytes(bytes.try_into().expect("eight bytes")))
    }

    #[inline]
    fn string(&mut self, wire: u8) -> Result<&'a str, DecodeError> {
        Self::expect(wire, DELIMITED)?;
        let len = self.varint()?;
        let bytes = self.take(len)?;
        std::str::from_utf8(bytes).map_err(|_| DecodeError("invalid string value: data is not UTF-8 encoded"))
    }

    /// A nested message's bytes, at `depth` levels of nesting left.
    #[inline]
    fn message(&mut self, wire: u8, depth: u32) -> Result<Reader<'a>, DecodeError> {
        Self::expect(wire, DELIMITED)?;
        if depth == 0 {
            return Err(DecodeError("recursion limit reached"));
        }
        let len = self.varint()?;
        Ok(Reader { buf: self.take(len)? })
    }

    /// Skips a field the contract does not know (or no longer has).
    fn skip(&mut self, wire: u8, tag: u32, depth: u32) -> Result<(), DecodeError> {
        if depth == 0 {
            return Err(DecodeError("recursion limit reached"));
        }
        match wire {
            VARINT => self.varint().map(drop),
            FIXED64 => self.take(8).map(drop),
            FIXED32 => self.take(4).map(drop),
            DELIMITED => {
                let len = self.varint()?;
                self.take(len).map(drop)
            }
            START_GROUP => loop {
                let (inner, inner_wire) = self.key()?;
                if inner_wire == END_GROUP {
                    return if inner == tag { Ok(()) } else { Err(DecodeError("unexpected end group tag")) };
                }
                self.skip(inner_wire, inner, depth - 1)?;
            },
            _ => Err(DecodeError("unexpected end group tag")),
        }
    }

    /// The rest of this reader as a `GroupUsage`, its fields at `depth` levels left.
    fn usage(&mut self, depth: u32) -> Result<UsageView<'a>, DecodeError> {
        let mut u = UsageView::default();
        while !self.buf.is_empty() {
            let (tag, wire) = self.key()?;
            match tag {
                1 => u.group = self.string(wire)?,
                2 => u.demand = self.double(wire)?,
                3 => u.consumed = self.double(wire)?,
                4 => u.admitted = self.uint(wire)?,
                5 => u.throttled = self.uint(wire)?,
                6 => u.waiting = self.double(wire)?,
                7 => u.unthrottled = self.double(wire)?,
                8 => u.held = self.double(wire)?,
                9 => u.waited = self.uint(wire)?,
                11 => u.would_refuse = self.uint(wire)?,
                19 => u.largest = self.double(wire)?,
                // Proto3 reads a uint32 as its low 32 bits, as the generated code does.
                12 => u.in_flight = self.uint(wire)? as u32,
                13 => u.in_flight_asked = self.uint(wire)? as u32,
                14..=17 => {
                    let i = tag as usize - 14;
                    u.classes[i / 2][i % 2] = self.uint(wire)?;
                }
                18 => {
                    let mut inner = self.message(wire, depth)?;
                    // Merged as the detail is, when sent twice.
                    let q = u.quota.get_or_insert_default();
                    while !inner.buf.is_empty() {
                        let (tag, wire) = inner.key()?;
                        match tag {
                            1 => q.window = inner.uint(wire)?,
                            2 => q.given = inner.double(wire)?,
                            3 => q.used = inner.double(wire)?,
                            // Proto3 reads a uint32 as its low 32 bits.
                            4 => {
                                let ms = inner.uint(wire)? as u32;
                                q.lasts = (ms > 0).then(|| std::time::Duration::from_millis(u64::from(ms)));
                            }
                            _ => inner.skip(wire, tag, depth - 1)?,
                        }
                    }
                }
                10 => {
                    let mut inner = self.message(wire, depth)?;
                    // A message sent twice is merged: the later fields over the earlier.
                    let detail = u.detail.get_or_insert([0.0; 7]);
                    while !inner.buf.is_empty() {
                        let (tag, wire) = inner.key()?;
                        match tag {
                            1..=7 => detail[tag as usize - 1] = inner.double(wire)?,
                            _ => inner.skip(wire, tag, depth - 1)?,
                        }
                    }
                }
                _ => self.skip(wire, tag, depth)?,
            }
        }
        Ok(u)
    }
}

/// A grant's fields other than its group's name, as `v1::Grant` carries them.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct GrantFields {
    /// Not throttled.
    pub unlimited: bool,
    /// Units/s.
    pub rate: f64,
    /// Units the client may bank.
    pub burst: f64,
    /// How long the grant holds without renewal.
    pub lease_ms: u32,
    /// The group's reservation.
    pub reserved: f64,
    /// The group's clients.
    pub clients: u32,
    /// Dropped work counts as consumed.
    pub count_dropped: bool,
    /// Over how long a debt is paid back.
    pub debt_repay_ms: u32,
    /// Over how long a rising rate is taken up.
    pub trickle_ms: u32,
    /// Shadow mode: admit everything, counting what would have been refused.
    pub shadow: bool,
    /// The share of the burst kept for critical work.
    pub critical_reserve: f64,
    /// The client's share of the group's in-flight quota (`None`: no such limit).
    pub in_flight: Option<u32>,
    /// The client's allotment of the group's quotas (`None`: no quota).
    pub quota: Option<tollgate_model::engine::Allotment>,
}

/// An allotment as the contract carries it.
pub fn allotment(a: &tollgate_model::engine::Allotment) -> v1::QuotaAllotment {
    let ms = |d: std::time::Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    v1::QuotaAllotment {
        window: a.window,
        add: a.add,
        ends_in_ms: a.ends_in.map_or(0, |d| ms(d).max(1)),
        left: a.left,
        reset_in_ms: a.reset_in.map(ms),
    }
}

/// An allotment the contract carries, as the engine takes it.
pub fn allotment_in(q: &v1::QuotaAllotment) -> tollgate_model::engine::Allotment {
    tollgate_model::engine::Allotment {
        window: q.window,
        add: q.add,
        ends_in: (q.ends_in_ms > 0).then(|| std::time::Duration::from_millis(q.ends_in_ms)),
        left: q.left,
        reset_in: q.reset_in_ms.map(std::time::Duration::from_millis),
    }
}

impl GrantFields {
    /// The generated type's grant for `group`.
    pub fn grant(&self, group: String) -> v1::Grant {
        v1::Grant {
            group,
            unlimited: self.unlimited,
            rate: self.rate,
            burst: self.burst,
            lease_ms: self.lease_ms,
            reserved: self.reserved,
            clients: self.clients,
            count_dropped: self.count_dropped,
            debt_repay_ms: self.debt_repay_ms,
            trickle_ms: self.trickle_ms,
            shadow: self.shadow,
            critical_reserve: self.critical_reserve,
            in_flight_limited: self.in_flight.is_some(),
            in_flight: self.in_flight.unwrap_or(0),
            shard: None,
            quota: self.quota.as_ref().map(allotment),
        }
    }
}

/// Writes an encoded `ExchangeResponse`: the grants one by one, then the rest.
#[derive(Debug, Default)]
pub struct AnswerWriter {
    buf: Vec<u8>,
}

/// A varint's length in bytes.
#[inline]
fn varint_len(v: u64) -> usize {
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

impl AnswerWriter {
    /// A writer with room for `grants` grants of short names.
    pub fn with_capacity(grants: usize) -> Self {
        Self { buf: Vec::with_capacity(grants * 64 + 16) }
    }

    #[inline]
    fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.buf.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.buf.push(v as u8);
    }

    /// A key of one byte (fields 1 to 15).
    #[inline]
    fn key(&mut self, tag: u8, wire: u8) {
        self.buf.push((tag << 3) | wire);
    }

    #[inline]
    fn uint(&mut self, tag: u8, v: u32) {
        if v != 0 {
            self.key(tag, VARINT);
            self.varint(u64::from(v));
        }
    }

    #[inline]
    fn flag(&mut self, tag: u8, v: bool) {
        if v {
            self.key(tag, VARINT);
            self.buf.push(1);
        }
    }

    #[inline]
    fn double(&mut self, tag: u8, v: f64) {
        // Proto3 leaves out a zero, and -0.0 is one (as the generated code compares).
        if v != 0.0 {
            self.key(tag, FIXED64);
            self.buf.extend_from_slice(&v.to_le_bytes());
        }
    }

    /// Appends the grant for `group`.
    pub fn grant(&mut self, group: &str, f: &GrantFields) {
        self.grant_in_shard(group, f, None);
    }

    /// Appends the grant for `group`, naming its `shard` when the groups are sharded.
    pub fn grant_in_shard(&mut self, group: &str, f: &GrantFields, shard: Option<u32>) {
        let uint = |tag_and_value: u32| {
            if tag_and_value == 0 { 0 } else { 1 + varint_len(u64::from(tag_and_value)) }
        };
        let double = |v: f64| if v != 0.0 { 9 } else { 0 };
        let name = if group.is_empty() { 0 } else { 1 + varint_len(group.len() as u64) + group.len() };
        let len = name
            + 2 * usize::from(f.unlimited)
            + double(f.rate)
            + double(f.burst)
            + uint(f.lease_ms)
            + double(f.reserved)
            + uint(f.clients)
            + 2 * usize::from(f.count_dropped)
            + uint(f.debt_repay_ms)
            + uint(f.trickle_ms)
            + 2 * usize::from(f.shadow)
            + double(f.critical_reserve)
            + 2 * usize::from(f.in_flight.is_some())
            + uint(f.in_flight.unwrap_or(0))
            // An optional field is written when set, 0 included.
            + shard.map_or(0, |s| 1 + varint_len(u64::from(s)));
        let quota = f.quota.as_ref().map(allotment);
        let len = len + quota.as_ref().map_or(0, |q| prost::encoding::message::encoded_len(16, q));
        self.key(1, DELIMITED);
        self.varint(len as u64);
        if !group.is_empty() {
            self.key(1, DELIMITED);
            self.varint(group.len() as u64);
            self.buf.extend_from_slice(group.as_bytes());
        }
        self.flag(2, f.unlimited);
        self.double(3, f.rate);
        self.double(4, f.burst);
        self.uint(5, f.lease_ms);
        self.double(6, f.reserved);
        self.uint(7, f.clients);
        self.flag(8, f.count_dropped);
        self.uint(9, f.debt_repay_ms);
        self.uint(10, f.trickle_ms);
        self.flag(11, f.shadow);
        self.double(12, f.critical_reserve);
        self.flag(13, f.in_flight.is_some());
        self.uint(14, f.in_flight.unwrap_or(0));
        if let Some(s) = shard {
            self.key(15, VARINT);
            self.varint(u64::from(s));
        }
        if let Some(q) = &quota {
            prost::encoding::message::encode(16, q, &mut self.buf);
        }
    }

    /// The answer, with the fields after the grants.
    pub fn finish(mut self, next_exchange_ms: u32, next_tick_ms: u32, unthrottled_allowed: bool) -> Vec<u8> {
        self.uint(2, next_exchange_ms);
        self.uint(3, next_tick_ms);
        self.flag(4, unthrottled_allowed);
        self.buf
    }

    /// The answer as [`finish`](Self::finish) writes it, with the shard map after the rest.
    pub fn finish_with_map(
        self,
        next_exchange_ms: u32,
        next_tick_ms: u32,
        unthrottled_allowed: bool,
        map: Option<&v1::ShardMap>,
    ) -> Vec<u8> {
        let mut buf = self.finish(next_exchange_ms, next_tick_ms, unthrottled_allowed);
        if let Some(map) = map {
            prost::encoding::message::encode(5, map, &mut buf);
        }
        buf
    }
}

/// A gRPC codec passing encoded messages through as they are: the server reads exchanges with
/// [`ExchangeView::decode`] and answers them with [`AnswerWriter`], and a load program sends
/// requests encoded once.
#[derive(Debug, Clone, Copy, Default)]
pub struct BytesCodec;

impl tonic::codec::Codec for BytesCodec {
    type Encode = prost::bytes::Bytes;
    type Decode = prost::bytes::Bytes;
    type Encoder = BytesCodec;
    type Decoder = BytesCodec;

    fn encoder(&mut self) -> Self::Encoder {
        BytesCodec
    }

    fn decoder(&mut self) -> Self::Decoder {
        BytesCodec
    }
}

impl tonic::codec::Encoder for BytesCodec {
    type Item = prost::bytes::Bytes;
    type Error = tonic::Status;

    fn encode(&mut self, item: Self::Item, dst: &mut tonic::codec::EncodeBuf<'_>) -> Result<(), Self::Error> {
        prost::bytes::BufMut::put(dst, item);
        Ok(())
    }
}

impl tonic::codec::Decoder for BytesCodec {
    type Item = prost::bytes::Bytes;
    type Error = tonic::Status;

    fn decode(&mut self, src: &mut tonic::codec::DecodeBuf<'_>) -> Result<Option<Self::Item>, Self::Error> {
        // The whole message, without a copy (tonic's buffer is split off).
        let n = prost::bytes::Buf::remaining(src);
        Ok(Some(prost::bytes::Buf::copy_to_bytes(src, n)))
    }
}

#[cfg(test)]
mod tests;
