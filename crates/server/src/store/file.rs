//! The default store: an embedded database file (redb).
//!
//! A change is written and committed (redb's default durability: flushed to disk) before it
//! is acknowledged. Settings are the contract's own messages, encoded with prost, so the file
//! format is versioned with the contract; meters and ramps are fixed little-endian records.
//! Every record carries a checksum of its key and value ([`super::seal`]). A file another
//! process holds, or one that cannot be read or whose records fail their checks, is an error at
//! start naming what is wrong, never a silent reset.

use std::path::{Path, PathBuf};

use prost::Message;
use redb::{
    Database, ReadOnlyDatabase, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition,
    TableHandle,
};
use tollgate_model::engine::Meter;
use tollgate_model::settings::{GroupName, GroupSettings};
use tollgate_proto::v1;

use super::seal::{FORMAT, SEALED, seal, unseal, usage_key};
use super::{AuditRecord, SettingsStore, StoreError, Stored, StoredNode, StoredRamp};
use crate::convert;

const GROUPS: TableDefinition<&str, &[u8]> = TableDefinition::new("groups");
const NODE: TableDefinition<&str, &[u8]> = TableDefinition::new("node");
const METERS: TableDefinition<&str, &[u8]> = TableDefinition::new("meters");
const RAMPS: TableDefinition<&str, &[u8]> = TableDefinition::new("ramps");
const AUDIT: TableDefinition<u64, &[u8]> = TableDefinition::new("audit");
const CREDENTIALS: TableDefinition<&str, &[u8]> = TableDefinition::new("credentials");
/// Usage records: (minute, group) → the group's meter then.
const USAGE: TableDefinition<(u64, &str), &[u8]> = TableDefinition::new("usage");
const NODE_KEY: &str = "node";
/// The RLS mapping rules, as JSON, beside the node settings.
const RLS_KEY: &str = "rls_rules";
/// The database file's name inside the data directory.
pub const FILE_NAME: &str = "tollgate.redb";

/// Opens the database again after a failure.
type Reopen = Box<dyn Fn() -> Result<Database, StoreError> + Send>;

/// Settings in an embedded database file (or any redb storage backend).
///
/// After a failed write (a full disk, say) redb refuses every later one until the database is
/// opened again; so a failure closes it, is logged, and the next write opens it again: once
/// the cause is gone (space freed), writes succeed without a restart. Until then
/// [`SettingsStore::health`] says what is wrong.
pub struct RedbStore {
    db: Option<Database>,
    path: PathBuf,
    reopen: Reopen,
    failed: Option<String>,
    /// The audit record of the next settings write.
    staged: Option<AuditRecord>,
}

impl RedbStore {
    /// Opens the store in `dir`, creating it only if its file does not exist. A file that
    /// exists but is not a readable Tollgate data file (empty, damaged, another format) is an
    /// error naming it, and is left exactly as it was: it is checked read-only first, and a
    /// file that needs recovery after a crash is recovered on a copy that replaces it only once
    /// the recovery succeeded.
    pub fn open(dir: &Path) -> Result<RedbStore, StoreError> {
        std::fs::create_dir_all(dir)
            .map_err(|source| StoreError::Directory { path: dir.to_path_buf(), source })?;
        let path = dir.join(FILE_NAME);
        let db = open_file(&path)?;
        let reopen_path = path.clone();
        RedbStore::with(db, path, Box::new(move || open_file(&reopen_path)))
    }

    /// A store on any redb storage backend (tests use ones that fail or crash on purpose);
    /// `label` names it in errors. The backend is cloned to open the database again.
    pub fn with_backend<B>(label: &str, backend: B) -> Result<RedbStore, StoreError>
    where
        B: redb::StorageBackend + Clone,
    {
        let path = PathBuf::from(label);
        let open = {
            let path = path.clone();
            move || {
                guarded(|| redb::Builder::new().create_with_backend(backend.clone()))
                    .map_err(|reason| StoreError::Unreadable { path: path.clone(), reason })?
                    .map_err(|e| database_error(&path, e))
            }
        };
        let db = open()?;
        RedbStore::with(db, path, Box::new(open))
    }

    fn with(db: Database, path: PathBuf, reopen: Reopen) -> Result<RedbStore, StoreError> {
        let mut store = RedbStore { db: Some(db), path, reopen, failed: None, staged: None };
        // Create the tables so that reads of a new store find them.
        store.write(|txn| {
            txn.open_table(GROUPS)?;
            txn.open_table(NODE)?;
            txn.open_table(METERS)?;
            txn.open_table(RAMPS)?;
            seal_all(txn)
        })?;
        Ok(store)
    }

    fn io(&self, e: impl std::fmt::Display) -> StoreError {
        StoreError::Io { path: self.path.clone(), reason: e.to_string() }
    }

    fn corrupt(&self, what: String, reason: impl std::fmt::Display) -> StoreError {
        StoreError::Corrupt { path: self.path.clone(), what, reason: reason.to_string() }
    }

    /// The database, opened again if a failure closed it.
    fn db(&mut self) -> Result<&Database, StoreError> {
        if self.db.is_none() {
            let db = (self.reopen)()?;
            self.db = Some(db);
        }
        Ok(self.db.as_ref().expect("opened above"))
    }

    /// Runs `f` in a write transaction and commits it (durably) before returning, with the
    /// staged audit record, if any.
    fn write(
        &mut self,
        f: impl FnOnce(&redb::WriteTransaction) -> Result<(), redb::Error>,
    ) -> Result<(), StoreError> {
        let staged = self.staged.take();
        let commit = |db: &Database| -> Result<(), String> {
            let txn = db.begin_write().map_err(|e| e.to_string())?;
            f(&txn).map_err(|e| e.to_string())?;
            if let Some(record) = &staged {
                append_audit_in(&txn, record).map_err(|e| e.to_string())?;
            }
            txn.commit().map_err(|e| e.to_string())
        };
        let result = self
            .db()
            .and_then(|db| commit(db).map_err(|reason| StoreError::Io { path: PathBuf::new(), reason }));
        match result {
            Ok(()) => {
                if let Some(before) = self.failed.take() {
                    tracing::info!(path = %self.path.display(), %before, "the data file takes writes again");
                }
                Ok(())
            }
            Err(e) => {
                let reason = match e {
                    StoreError::Io { reason, .. } => reason,
                    other => other.to_string(),
                };
                tracing::error!(path = %self.path.display(), %reason, "a write to the data file failed; nothing was acknowledged; the next write opens the file again");
                // redb takes no write after a failed one until it is opened again.
                self.db = None;
                self.failed = Some(reason.clone());
                Err(self.io(reason))
            }
        }
    }
}

/// Opens the data file at `path`; see [`RedbStore::open`].
fn open_file(path: &Path) -> Result<Database, StoreError> {
    let unreadable = |reason: String| StoreError::Unreadable { path: path.to_path_buf(), reason };
    match std::fs::metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Database::create(path).map_err(|e| database_error(path, e))
        }
        Err(e) => Err(unreadable(e.to_string())),
        Ok(meta) if meta.len() == 0 => Err(unreadable(
            "the file is empty (0 bytes), so it is not a Tollgate data file; nothing was changed \
             (move it away to start with no settings)"
                .into(),
        )),
        Ok(_) => {
            match guarded(|| ReadOnlyDatabase::open(path).map(drop)) {
                Ok(Ok(())) => {}
                // Not closed cleanly (a crash): recover a copy, then put it in place.
                Ok(Err(redb::DatabaseError::RepairAborted)) => recover(path)?,
                Ok(Err(e)) => return Err(database_error(path, e)),
                Err(panic) => return Err(unreadable(format!("{panic}; nothing was changed"))),
            }
            // Damage past the header shows only when its pages are read: every entry is read
            // while the file is open read-only, and it is opened for writing only once known
            // good.
            match guarded(|| verify(path)) {
                Ok(Ok(())) => {}
                Ok(Err(reason)) | Err(reason) => {
                    return Err(unreadable(format!("{reason}; nothing was changed")));
                }
            }
            guarded(|| Database::open(path)).map_err(unreadable)?.map_err(|e| database_error(path, e))
        }
    }
}

impl RedbStore {
    /// Reads every entry of `table`, decoding each with `decode`.
    fn read_all<T>(
        &self,
        txn: &redb::ReadTransaction,
        table: TableDefinition<&str, &[u8]>,
        what: &str,
        mut decode: impl FnMut(&[u8]) -> Result<T, String>,
    ) -> Result<Vec<(GroupName, T)>, StoreError> {
        let table = txn.open_table(table).map_err(|e| self.io(e))?;
        let mut out = Vec::new();
        for entry in table.iter().map_err(|e| self.io(e))? {
            let (k, v) = entry.map_err(|e| self.io(e))?;
            let label = format!("{what} {:?}", k.value());
            let name = GroupName::new(k.value()).map_err(|e| self.corrupt(label.clone(), e))?;
            let payload =
                unseal(k.value().as_bytes(), v.value()).map_err(|e| self.corrupt(label.clone(), e))?;
            let value = decode(payload).map_err(|e| self.corrupt(label, e))?;
            out.push((name, value));
        }
        Ok(out)
    }
}

/// Writes `meters` in `txn`, and each as its group's usage record for the minute starting at
/// `minute_unix_ms`, dropping the oldest records past the bound.
fn write_meters(
    txn: &redb::WriteTransaction,
    meters: &[(GroupName, Meter)],
    minute_unix_ms: u64,
) -> Result<(), redb::Error> {
    let mut table = txn.open_table(METERS)?;
    for (name, m) in meters {
        table.insert(name.as_str(), seal(name.as_str().as_bytes(), &encode_meter(m)).as_slice())?;
    }
    drop(table);
    write_usage(txn, meters, minute_unix_ms)
}

/// Writes each of `meters` in `txn` as its group's usage record for the minute starting at
/// `minute_unix_ms`, dropping the oldest records past the bound.
fn write_usage(
    txn: &redb::WriteTransaction,
    meters: &[(GroupName, Meter)],
    minute_unix_ms: u64,
) -> Result<(), redb::Error> {
    let mut usage = txn.open_table(USAGE)?;
    for (name, m) in meters {
        let sealed = seal(&usage_key(minute_unix_ms, name.as_str()), &encode_meter(m));
        usage.insert((minute_unix_ms, name.as_str()), sealed.as_slice())?;
    }
    while usage.len()? > super::USAGE_MAX as u64 {
        usage.pop_first()?;
    }
    Ok(())
}

/// Appends `record` to the audit log in `txn`, dropping the oldest past the bound.
fn append_audit_in(txn: &redb::WriteTransaction, record: &AuditRecord) -> Result<(), redb::Error> {
    let mut table = txn.open_table(AUDIT)?;
    let last = table.last()?.map(|(k, _)| k.value());
    let key = super::audit_key(record.at_unix_ms, last);
    table.insert(key, seal(&key.to_be_bytes(), record.to_json().as_bytes()).as_slice())?;
    while table.len()? > super::AUDIT_MAX as u64 {
        table.pop_first()?;
    }
    Ok(())
}

/// Reads every entry of every table of the file at `path`, opened read-only: a damaged page
/// is an error (or a panic, which the caller guards against) here rather than once the file
/// is open for writing; in a file whose records carry checksums, so is a record that fails its
/// check, named.
fn verify(path: &Path) -> Result<(), String> {
    fn each<K: redb::Key + 'static>(
        txn: &redb::ReadTransaction,
        table: TableDefinition<K, &[u8]>,
        sealed: bool,
        key: impl Fn(K::SelfType<'_>) -> (Vec<u8>, String),
    ) -> Result<(), String> {
        let name = table.name().to_string();
        let table = match txn.open_table(table) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(()),
            Err(e) => return Err(format!("the file is damaged ({e})")),
        };
        for entry in table.iter().map_err(|e| format!("the file is damaged ({e})"))? {
            let (k, v) = entry.map_err(|e| format!("the file is damaged ({e})"))?;
            let value = std::hint::black_box(v.value());
            if sealed {
                let (bytes, label) = key(k.value());
                unseal(&bytes, value).map_err(|e| format!("{name} record {label}: {e}"))?;
            }
        }
        Ok(())
    }
    let db = ReadOnlyDatabase::open(path).map_err(|e| e.to_string())?;
    let txn = db.begin_read().map_err(|e| format!("the file is damaged ({e})"))?;
    let sealed = match txn.open_table(FORMAT) {
        Ok(t) => t.get(SEALED).map_err(|e| format!("the file is damaged ({e})"))?.is_some(),
        Err(redb::TableError::TableDoesNotExist(_)) => false,
        Err(e) => return Err(format!("the file is damaged ({e})")),
    };
    for table in [GROUPS, NODE, METERS, RAMPS, CREDENTIALS] {
        each(&txn, table, sealed, |k: &str| (k.as_bytes().to_vec(), format!("{k:?}")))?;
    }
    each(&txn, AUDIT, sealed, |k: u64| (k.to_be_bytes().to_vec(), k.to_string()))?;
    each(&txn, USAGE, sealed, |(minute, group): (u64, &str)| {
        (usage_key(minute, group), format!("{group:?} at {minute}"))
    })
}

/// Seals every record of a file written before records carried checksums, and marks the
/// file; a file marked already is left alone.
fn seal_all(txn: &redb::WriteTransaction) -> Result<(), redb::Error> {
    let mut format = txn.open_table(FORMAT)?;
    if format.get(SEALED)?.is_some() {
        return Ok(());
    }
    for def in [GROUPS, NODE, METERS, RAMPS, CREDENTIALS] {
        let mut table = txn.open_table(def)?;
        let all = table
            .iter()?
            .map(|e| e.map(|(k, v)| (k.value().to_string(), v.value().to_vec())))
            .collect::<Result<Vec<_>, _>>()?;
        for (k, v) in all {
            table.insert(k.as_str(), seal(k.as_bytes(), &v).as_slice())?;
        }
    }
    let mut audit = txn.open_table(AUDIT)?;
    let all = audit
        .iter()?
        .map(|e| e.map(|(k, v)| (k.value(), v.value().to_vec())))
        .collect::<Result<Vec<_>, _>>()?;
    for (k, v) in all {
        audit.insert(k, seal(&k.to_be_bytes(), &v).as_slice())?;
    }
    let mut usage = txn.open_table(USAGE)?;
    let all = usage
        .iter()?
        .map(|e| e.map(|(k, v)| (k.value().0, k.value().1.to_string(), v.value().to_vec())))
        .collect::<Result<Vec<_>, _>>()?;
    for (minute, group, v) in all {
        usage.insert((minute, group.as_str()), seal(&usage_key(minute, &group), &v).as_slice())?;
    }
    format.insert(SEALED, 1)?;
    Ok(())
}

/// Runs `f`, turning a panic inside the database library (a damaged file can cause one) into
/// an error.
fn guarded<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|panic| {
        let what = panic
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| panic.downcast_ref::<&str>().copied())
            .unwrap_or("the database library failed");
        format!("the file is damaged ({what})")
    })
}

fn database_error(path: &Path, e: redb::DatabaseError) -> StoreError {
    match e {
        redb::DatabaseError::DatabaseAlreadyOpen => StoreError::Locked { path: path.to_path_buf() },
        other => StoreError::Unreadable {
            path: path.to_path_buf(),
            reason: format!("{other}; nothing was changed"),
        },
    }
}

/// Recovers a data file that was not closed cleanly, on a copy: the copy replaces the file only
/// once the recovery succeeded, so a file that cannot be recovered stays exactly as it was.
fn recover(path: &Path) -> Result<(), StoreError> {
    let copy = path.with_extension("redb.recovering");
    let unreadable = |reason: String| StoreError::Unreadable { path: path.to_path_buf(), reason };
    std::fs::copy(path, &copy).map_err(|e| unreadable(format!("cannot copy it to recover it: {e}")))?;
    let recovered = guarded(|| Database::open(&copy).map(drop));
    match recovered {
        Ok(Ok(())) => {
            std::fs::rename(&copy, path)
                .map_err(|e| unreadable(format!("cannot put the recovered copy in place: {e}")))?;
            tracing::warn!(path = %path.display(), "data file was not closed cleanly; recovered it");
            Ok(())
        }
        Ok(Err(e)) => {
            let _ = std::fs::remove_file(&copy);
            Err(unreadable(format!("it needs recovery, which failed: {e}; nothing was changed")))
        }
        Err(panic) => {
            let _ = std::fs::remove_file(&copy);
            Err(unreadable(format!("{panic}; nothing was changed")))
        }
    }
}

pub(super) fn encode_meter(m: &Meter) -> [u8; 40] {
    let mut out = [0u8; 40];
    out[..8].copy_from_slice(&m.consumed.to_le_bytes());
    out[8..16].copy_from_slice(&m.admitted.to_le_bytes());
    out[16..24].copy_from_slice(&m.throttled.to_le_bytes());
    out[24..32].copy_from_slice(&m.waited.to_le_bytes());
    out[32..].copy_from_slice(&m.would_refuse.to_le_bytes());
    out
}

/// A meter: 40 bytes; or 32, as written before shadow mode's would-be refusals were counted;
/// or 24, before waited requests were.
pub(super) fn decode_meter(b: &[u8]) -> Result<Meter, String> {
    if ![24, 32, 40].contains(&b.len()) {
        return Err(format!("a meter is 24, 32 or 40 bytes, found {}", b.len()));
    }
    let word = |i: usize| <[u8; 8]>::try_from(&b[i..i + 8]).map_or(0, u64::from_le_bytes);
    let consumed = f64::from_bits(word(0));
    if !(consumed.is_finite() && consumed >= 0.0) {
        return Err(format!("consumed units must be finite and not negative, found {consumed}"));
    }
    let waited = if b.len() >= 32 { word(24) } else { 0 };
    let would_refuse = if b.len() == 40 { word(32) } else { 0 };
    Ok(Meter { consumed, admitted: word(8), throttled: word(16), waited, would_refuse })
}

pub(super) fn encode_ramp(r: &StoredRamp) -> [u8; 16] {
    let mut out = [0u8; 16];
    out[..8].copy_from_slice(&r.value.to_le_bytes());
    out[8..].copy_from_slice(&r.until_unix_ms.to_le_bytes());
    out
}

pub(super) fn decode_ramp(b: &[u8]) -> Result<StoredRamp, String> {
    let b: &[u8; 16] = b.try_into().map_err(|_| format!("a ramp is 16 bytes, found {}", b.len()))?;
    let value = f64::from_le_bytes(b[..8].try_into().expect("8 bytes"));
    if !(value.is_finite() && value >= 0.0) {
        return Err(format!("a ramp's value must be finite and not negative, found {value}"));
    }
    Ok(StoredRamp { value, until_unix_ms: u64::from_le_bytes(b[8..].try_into().expect("8 bytes")) })
}

impl SettingsStore for RedbStore {
    fn health(&self) -> Option<String> {
        self.failed.clone()
    }

    fn append_audit(&mut self, record: &AuditRecord) -> Result<(), StoreError> {
        self.write(|txn| append_audit_in(txn, record))
    }

    fn audited(&mut self, record: AuditRecord) -> &mut dyn SettingsStore {
        self.staged = Some(record);
        self
    }

    fn audit(&mut self, since_unix_ms: u64, limit: usize) -> Result<Vec<AuditRecord>, StoreError> {
        let txn = self.db()?.begin_read().map_err(|e| self.io(e))?;
        let table = match txn.open_table(AUDIT) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
            Err(e) => return Err(self.io(e)),
        };
        let mut out = Vec::new();
        for entry in table.range(super::audit_key(since_unix_ms, None)..).map_err(|e| self.io(e))? {
            if out.len() >= limit {
                break;
            }
            let (k, v) = entry.map_err(|e| self.io(e))?;
            let payload = unseal(&k.value().to_be_bytes(), v.value())
                .map_err(|e| self.corrupt(format!("audit record {}", k.value()), e))?;
            let text = String::from_utf8_lossy(payload).into_owned();
            out.push(AuditRecord::from_json(&text).map_err(|e| self.corrupt("audit record".into(), e))?);
        }
        Ok(out)
    }

    fn recent_groups(&mut self, since_unix_ms: u64, limit: usize) -> Result<Vec<GroupName>, StoreError> {
        let txn = self.db()?.begin_read().map_err(|e| self.io(e))?;
        let table = match txn.open_table(USAGE) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
            Err(e) => return Err(self.io(e)),
        };
        // Keys sort by minute first: the range holds only the recent minutes.
        let mut names = Vec::new();
        for entry in table.range((since_unix_ms, "")..).map_err(|e| self.io(e))? {
            let (k, _) = entry.map_err(|e| self.io(e))?;
            let (minute, name) = k.value();
            let name = GroupName::new(name)
                .map_err(|e| self.corrupt(format!("usage record {name:?} at {minute}"), e))?;
            names.push(name);
        }
        Ok(super::distinct(names.into_iter(), limit))
    }

    fn usage(
        &mut self,
        group: Option<&GroupName>,
        since_unix_ms: u64,
        limit: usize,
    ) -> Result<Vec<super::UsageRecord>, StoreError> {
        let txn = self.db()?.begin_read().map_err(|e| self.io(e))?;
        let table = match txn.open_table(USAGE) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
            Err(e) => return Err(self.io(e)),
        };
        let mut pick = super::UsageSelector::new(group, since_unix_ms, limit);
        for entry in table.iter().map_err(|e| self.io(e))? {
            let (k, v) = entry.map_err(|e| self.io(e))?;
            let (minute, name) = k.value();
            if !pick.wants(name) {
                continue;
            }
            let label = format!("usage record {name:?} at {minute}");
            let name = GroupName::new(name).map_err(|e| self.corrupt(label.clone(), e))?;
            let payload = unseal(&usage_key(minute, name.as_str()), v.value())
                .map_err(|e| self.corrupt(label.clone(), e))?;
            let meter = decode_meter(payload).map_err(|e| self.corrupt(label, e))?;
            pick.push(super::UsageRecord { minute_unix_ms: minute, group: name, meter });
        }
        Ok(pick.finish())
    }

    fn load(&mut self) -> Result<Stored, StoreError> {
        let txn = self.db()?.begin_read().map_err(|e| self.io(e))?;
        let mut out = Stored::default();
        let groups = self.read_all(&txn, GROUPS, "group", |b| {
            let msg = v1::GroupSettings::decode(b).map_err(|e| e.to_string())?;
            convert::settings_from_proto(&msg).map_err(|e| e.to_string())
        })?;
        out.groups = groups.into_iter().collect();
        out.meters = self.read_all(&txn, METERS, "meter", decode_meter)?.into_iter().collect();
        out.ramps = self.read_all(&txn, RAMPS, "ramp", decode_ramp)?.into_iter().collect();
        match txn.open_table(CREDENTIALS) {
            Ok(table) => {
                for entry in table.iter().map_err(|e| self.io(e))? {
                    let (k, v) = entry.map_err(|e| self.io(e))?;
                    let label = format!("credential {:?}", k.value());
                    let payload = unseal(k.value().as_bytes(), v.value())
                        .map_err(|e| self.corrupt(label.clone(), e))?;
                    let text = std::str::from_utf8(payload).map_err(|e| self.corrupt(label, e))?;
                    out.credentials.insert(k.value().to_string(), text.to_string());
                }
            }
            Err(redb::TableError::TableDoesNotExist(_)) => {}
            Err(e) => return Err(self.io(e)),
        }
        let node = txn.open_table(NODE).map_err(|e| self.io(e))?;
        if let Some(v) = node.get(RLS_KEY).map_err(|e| self.io(e))? {
            let payload =
                unseal(RLS_KEY.as_bytes(), v.value()).map_err(|e| self.corrupt("RLS rules".into(), e))?;
            let text = std::str::from_utf8(payload).map_err(|e| self.corrupt("RLS rules".into(), e))?;
            out.rls_rules = Some(text.to_string());
        }
        if let Some(v) = node.get(NODE_KEY).map_err(|e| self.io(e))? {
            let payload = unseal(NODE_KEY.as_bytes(), v.value())
                .map_err(|e| self.corrupt("node settings".into(), e))?;
            let msg = v1::NodeInfo::decode(payload).map_err(|e| self.corrupt("node settings".into(), e))?;
            out.node = StoredNode::from_proto(&msg);
            out.node_stored = true;
        }
        Ok(out)
    }

    fn put_group(&mut self, name: &GroupName, settings: &GroupSettings) -> Result<(), StoreError> {
        let bytes = convert::settings_to_proto(settings).encode_to_vec();
        self.write(|txn| {
            txn.open_table(GROUPS)?
                .insert(name.as_str(), seal(name.as_str().as_bytes(), &bytes).as_slice())?;
            Ok(())
        })
    }

    fn put_groups(&mut self, groups: &[(&GroupName, &GroupSettings)]) -> Result<(), StoreError> {
        if groups.is_empty() {
            return Ok(());
        }
        let encoded: Vec<(&str, Vec<u8>)> = groups
            .iter()
            .map(|(name, s)| {
                let bytes = convert::settings_to_proto(s).encode_to_vec();
                (name.as_str(), seal(name.as_str().as_bytes(), &bytes))
            })
            .collect();
        self.write(|txn| {
            let mut table = txn.open_table(GROUPS)?;
            for (name, sealed) in &encoded {
                table.insert(*name, sealed.as_slice())?;
            }
            Ok(())
        })
    }

    fn drop_group(&mut self, name: &GroupName) -> Result<bool, StoreError> {
        let mut existed = false;
        self.write(|txn| {
            existed = txn.open_table(GROUPS)?.remove(name.as_str())?.is_some();
            txn.open_table(METERS)?.remove(name.as_str())?;
            Ok(())
        })?;
        Ok(existed)
    }

    fn put_credential(&mut self, id: &str, record: &str) -> Result<(), StoreError> {
        self.write(|txn| {
            txn.open_table(CREDENTIALS)?.insert(id, seal(id.as_bytes(), record.as_bytes()).as_slice())?;
            Ok(())
        })
    }

    fn drop_credential(&mut self, id: &str) -> Result<bool, StoreError> {
        let mut existed = false;
        self.write(|txn| {
            existed = txn.open_table(CREDENTIALS)?.remove(id)?.is_some();
            Ok(())
        })?;
        Ok(existed)
    }

    fn set_rls_rules(&mut self, json: &str) -> Result<(), StoreError> {
        self.write(|txn| {
            txn.open_table(NODE)?.insert(RLS_KEY, seal(RLS_KEY.as_bytes(), json.as_bytes()).as_slice())?;
            Ok(())
        })
    }

    fn set_node(&mut self, node: StoredNode) -> Result<(), StoreError> {
        let bytes = node.to_proto().encode_to_vec();
        self.write(|txn| {
            txn.open_table(NODE)?.insert(NODE_KEY, seal(NODE_KEY.as_bytes(), &bytes).as_slice())?;
            Ok(())
        })
    }

    fn put_meters(
        &mut self,
        meters: &[(GroupName, Meter)],
        ramps: &[(GroupName, StoredRamp)],
        minute_unix_ms: u64,
    ) -> Result<(), StoreError> {
        self.write(|txn| {
            write_meters(txn, meters, minute_unix_ms)?;
            txn.delete_table(RAMPS)?;
            let mut table = txn.open_table(RAMPS)?;
            for (name, r) in ramps {
                table.insert(name.as_str(), seal(name.as_str().as_bytes(), &encode_ramp(r)).as_slice())?;
            }
            Ok(())
        })
    }

    fn put_running_meters(
        &mut self,
        meters: &[(GroupName, Meter)],
        minute_unix_ms: u64,
    ) -> Result<(), StoreError> {
        if meters.is_empty() {
            return Ok(());
        }
        self.write(|txn| write_meters(txn, meters, minute_unix_ms))
    }

    fn put_usage(&mut self, meters: &[(GroupName, Meter)], minute_unix_ms: u64) -> Result<(), StoreError> {
        if meters.is_empty() {
            return Ok(());
        }
        self.write(|txn| write_usage(txn, meters, minute_unix_ms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_meter_written_before_waits_were_counted_still_reads() {
        let m = Meter { consumed: 7.5, admitted: 3, throttled: 2, waited: 9, would_refuse: 4 };
        let bytes = encode_meter(&m);
        assert_eq!(decode_meter(&bytes).unwrap(), m);
        assert_eq!(decode_meter(&bytes[..32]).unwrap(), Meter { would_refuse: 0, ..m });
        assert_eq!(decode_meter(&bytes[..24]).unwrap(), Meter { waited: 0, would_refuse: 0, ..m });
        assert_eq!(decode_meter(&bytes[..20]).unwrap_err(), "a meter is 24, 32 or 40 bytes, found 20");
    }

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("tollgate-store-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn settings_meters_and_ramps_survive_a_reopen() {
        let d = dir("reopen");
        let g = GroupName::new("a").unwrap();
        let meter = Meter { consumed: 12.5, admitted: 3, throttled: 4, waited: 5, would_refuse: 6 };
        let ramp = StoredRamp { value: 42.0, until_unix_ms: 1_700_000_000_000 };
        {
            let mut s = RedbStore::open(&d).unwrap();
            s.put_group(&g, &GroupSettings::builder().reserved(5.0).limit(10.0).build().unwrap()).unwrap();
            s.set_node(StoredNode {
                capacity: Some(1000.0),
                mode: tollgate_model::allocate::AllocationMode::Fcfs,
                slow_start: true,
                shadow: true,
                throttling: false,
            })
            .unwrap();
            s.put_meters(&[(g.clone(), meter)], &[(g.clone(), ramp)], 60_000).unwrap();
        }
        let mut s = RedbStore::open(&d).unwrap();
        let stored = s.load().unwrap();
        assert_eq!(stored.node.capacity, Some(1000.0));
        assert_eq!(stored.node.mode, tollgate_model::allocate::AllocationMode::Fcfs);
        assert!(stored.node.shadow && !stored.node.throttling, "{:?}", stored.node);
        assert_eq!(stored.groups[&g].reserved(), 5.0);
        assert_eq!(stored.meters[&g], meter);
        assert_eq!(stored.ramps[&g], ramp);
        s.put_meters(&[], &[], 120_000).unwrap();
        assert!(s.load().unwrap().ramps.is_empty(), "ramps are replaced as a whole");
        assert!(s.drop_group(&g).unwrap());
        assert!(!s.drop_group(&g).unwrap());
        let after = s.load().unwrap();
        assert!(after.groups.is_empty() && after.meters.is_empty());
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn many_groups_are_stored_in_one_write_and_read_back() {
        let d = dir("put-groups");
        let names: Vec<GroupName> = (0..1000).map(|i| GroupName::new(&format!("g{i}")).unwrap()).collect();
        let settings = GroupSettings::builder().limit(10.0).build().unwrap();
        {
            let mut s = RedbStore::open(&d).unwrap();
            let groups: Vec<(&GroupName, &GroupSettings)> = names.iter().map(|n| (n, &settings)).collect();
            s.put_groups(&groups).unwrap();
            s.put_groups(&[]).unwrap();
        }
        let loaded = RedbStore::open(&d).unwrap().load().unwrap();
        assert_eq!(loaded.groups.len(), 1000);
        assert_eq!(loaded.groups[&names[999]], settings);
    }

    #[test]
    fn usage_is_kept_by_the_minute_and_a_rewrite_replaces_its_minute() {
        let d = dir("usage");
        let (a, b) = (GroupName::new("a").unwrap(), GroupName::new("b").unwrap());
        let m = |consumed: f64| Meter { consumed, admitted: consumed as u64, ..Meter::default() };
        {
            let mut s = RedbStore::open(&d).unwrap();
            s.put_meters(&[(a.clone(), m(1.0)), (b.clone(), m(5.0))], &[], 60_000).unwrap();
            s.put_meters(&[(a.clone(), m(2.0))], &[], 120_000).unwrap();
            // Flushed again in the same minute: the minute's record is replaced, not added.
            s.put_meters(&[(a.clone(), m(3.0))], &[], 120_000).unwrap();
            s.put_meters(&[(a.clone(), m(7.0))], &[], 180_000).unwrap();
        }
        let mut s = RedbStore::open(&d).unwrap();
        let got = |s: &mut RedbStore, g: Option<&GroupName>, since: u64| -> Vec<(u64, String, f64)> {
            s.usage(g, since, 100)
                .unwrap()
                .into_iter()
                .map(|r| (r.minute_unix_ms, r.group.to_string(), r.meter.consumed))
                .collect()
        };
        assert_eq!(
            got(&mut s, None, 0),
            [
                (60_000, "a".into(), 1.0),
                (60_000, "b".into(), 5.0),
                (120_000, "a".into(), 3.0),
                (180_000, "a".into(), 7.0)
            ]
        );
        // From 2 minutes on: each group's last record before, then the span.
        assert_eq!(
            got(&mut s, None, 120_000),
            [
                (60_000, "a".into(), 1.0),
                (60_000, "b".into(), 5.0),
                (120_000, "a".into(), 3.0),
                (180_000, "a".into(), 7.0)
            ]
        );
        assert_eq!(got(&mut s, Some(&a), 180_000), [(120_000, "a".into(), 3.0), (180_000, "a".into(), 7.0)]);
        assert_eq!(s.usage(None, 0, 2).unwrap().len(), 2, "bounded by the limit");
        // The memory store keeps the same.
        let mut mem = crate::store::MemoryStore::default();
        mem.put_meters(&[(a.clone(), m(1.0))], &[], 60_000).unwrap();
        mem.put_meters(&[(a.clone(), m(4.0))], &[], 60_000).unwrap();
        let r = mem.usage(Some(&a), 0, 10).unwrap();
        assert_eq!((r.len(), r[0].meter.consumed), (1, 4.0));
        let _ = std::fs::remove_dir_all(&d);
    }

    fn settings() -> GroupSettings {
        GroupSettings::builder().reserved(5.0).limit(10.0).build().unwrap()
    }

    /// Regression: a data file truncated to 0 bytes was silently reset, every tenant unlimited.
    #[test]
    fn an_empty_file_is_refused_and_left_as_it_is() {
        let d = dir("empty");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join(FILE_NAME), b"").unwrap();
        let e = RedbStore::open(&d).err().expect("refused");
        assert!(e.to_string().contains("is empty (0 bytes)"), "{e}");
        assert_eq!(std::fs::metadata(d.join(FILE_NAME)).unwrap().len(), 0, "still empty");
        let _ = std::fs::remove_dir_all(&d);
    }

    /// Regression: 64 KiB of random bytes in the middle of a data file made the start panic, and the
    /// failed start rewrote 18 bytes of its header.
    #[test]
    fn a_damaged_file_is_a_clear_error_and_left_byte_for_byte() {
        let d = dir("damaged");
        {
            let mut s = RedbStore::open(&d).unwrap();
            for i in 0..50 {
                s.put_group(&GroupName::new(&format!("g{i}")).unwrap(), &settings()).unwrap();
            }
        }
        let path = d.join(FILE_NAME);
        let mut bytes = std::fs::read(&path).unwrap();
        let middle = bytes.len() / 2;
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for b in bytes.iter_mut().skip(middle.saturating_sub(32 * 1024)).take(64 * 1024) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
        // And a header that is not a database at all.
        for (name, damaged) in [
            ("middle", bytes.clone()),
            ("header", {
                let mut h = bytes.clone();
                h[..64].copy_from_slice(&[0x5a; 64]);
                h
            }),
        ] {
            std::fs::write(&path, &damaged).unwrap();
            let mut opened = RedbStore::open(&d);
            match &mut opened {
                Err(e) => {
                    assert!(matches!(e, StoreError::Unreadable { .. }), "{name}: {e}");
                    assert!(std::fs::read(&path).unwrap() == damaged, "{name}: the damaged file was changed");
                }
                // Damage in pages the database does not use may go unnoticed: fine, as long as
                // everything it holds reads back right.
                Ok(store) => {
                    assert_ne!(name, "header", "a file with no header opened");
                    let stored = store.load().expect("a file that opened loads");
                    assert!(stored.groups.values().all(|s| *s == settings()), "{name}");
                }
            }
            drop(opened);
        }
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_file_left_open_by_a_crash_is_recovered() {
        let d = dir("crash");
        let copy = dir("crash-copy");
        std::fs::create_dir_all(&copy).unwrap();
        let g = GroupName::new("kept").unwrap();
        let mut s = RedbStore::open(&d).unwrap();
        s.put_group(&g, &settings()).unwrap();
        // A copy taken while the store is open is what a kill -9 leaves behind.
        std::fs::copy(d.join(FILE_NAME), copy.join(FILE_NAME)).unwrap();
        drop(s);
        let mut recovered = RedbStore::open(&copy).unwrap();
        assert_eq!(recovered.load().unwrap().groups[&g], settings());
        assert!(!copy.join("tollgate.redb.recovering").exists());
        let _ = std::fs::remove_dir_all(&d);
        let _ = std::fs::remove_dir_all(&copy);
    }

    #[test]
    fn a_file_in_use_or_corrupt_is_a_clear_error() {
        let d = dir("locked");
        let first = RedbStore::open(&d).unwrap();
        let e = RedbStore::open(&d).err().expect("locked");
        assert!(e.to_string().contains("in use by another process"), "{e}");
        drop(first);
        std::fs::write(d.join(FILE_NAME), b"this is not a database").unwrap();
        let e = RedbStore::open(&d).err().expect("corrupt");
        assert!(matches!(e, StoreError::Unreadable { .. }), "{e}");
        assert_eq!(std::fs::read(d.join(FILE_NAME)).unwrap(), b"this is not a database", "left as it was");
        let _ = std::fs::remove_dir_all(&d);
    }
}
