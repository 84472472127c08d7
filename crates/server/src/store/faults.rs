//! The data file under faults, in redb's own manner: a storage backend in memory that crashes
//! or fails after N operations, and checks at every N that every acknowledged write survives,
//! no unacknowledged one is half there, and a store that failed takes writes again once the
//! fault is gone.

use std::io;
use std::sync::{Arc, Mutex, PoisonError};

use tollgate_model::allocate::AllocationMode;
use tollgate_model::engine::Meter;
use tollgate_model::settings::{GroupName, GroupSettings};

use super::{RedbStore, SettingsStore, StoreError, Stored, StoredNode};

/// What happens once the operations run out.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Fault {
    /// The process dies: writes from then on never reach the disk.
    Crash,
    /// The disk is full: writes fail until it is healed.
    Full,
}

#[derive(Debug)]
struct Disk {
    bytes: Vec<u8>,
    ops: u64,
    budget: u64,
    fault: Fault,
    healed: bool,
}

/// A disk in memory that faults after `budget` writes, length changes and syncs.
#[derive(Debug, Clone)]
struct FaultyDisk(Arc<Mutex<Disk>>);

impl FaultyDisk {
    fn new(bytes: Vec<u8>, budget: u64, fault: Fault) -> Self {
        FaultyDisk(Arc::new(Mutex::new(Disk { bytes, ops: 0, budget, fault, healed: false })))
    }

    fn disk(&self) -> std::sync::MutexGuard<'_, Disk> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts one operation; says whether it may change the disk.
    fn spend(&self) -> io::Result<()> {
        let mut d = self.disk();
        d.ops += 1;
        if d.healed || d.ops <= d.budget {
            return Ok(());
        }
        Err(match d.fault {
            Fault::Crash => io::Error::other("crashed"),
            Fault::Full => io::Error::new(io::ErrorKind::StorageFull, "No space left on device"),
        })
    }

    fn bytes(&self) -> Vec<u8> {
        self.disk().bytes.clone()
    }

    fn ops(&self) -> u64 {
        self.disk().ops
    }

    fn heal(&self) {
        self.disk().healed = true;
    }
}

impl redb::StorageBackend for FaultyDisk {
    fn len(&self) -> io::Result<u64> {
        Ok(self.disk().bytes.len() as u64)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        let d = self.disk();
        let start = usize::try_from(offset).map_err(io::Error::other)?;
        let end = start + out.len();
        if end > d.bytes.len() {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "read past the end"));
        }
        out.copy_from_slice(&d.bytes[start..end]);
        Ok(())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.spend()?;
        self.disk().bytes.resize(usize::try_from(len).map_err(io::Error::other)?, 0);
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        self.spend()
    }

    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.spend()?;
        let mut d = self.disk();
        let start = usize::try_from(offset).map_err(io::Error::other)?;
        if start + data.len() > d.bytes.len() {
            d.bytes.resize(start + data.len(), 0);
        }
        d.bytes[start..start + data.len()].copy_from_slice(data);
        Ok(())
    }
}

fn name(i: usize) -> GroupName {
    GroupName::new(&format!("g{i}")).unwrap()
}

fn node(capacity: f64) -> StoredNode {
    StoredNode {
        capacity: Some(capacity),
        mode: AllocationMode::Fcfs,
        slow_start: true,
        shadow: true,
        throttling: false,
    }
}

fn settings(i: usize) -> GroupSettings {
    GroupSettings::builder().reserved(i as f64).limit(100.0 + i as f64).build().unwrap()
}

/// One change to the store, and what it leaves stored.
#[derive(Debug, Clone)]
enum Change {
    Put(usize),
    Drop(usize),
    Node(f64),
    Meter(usize, f64),
}

impl Change {
    fn apply(&self, store: &mut RedbStore) -> Result<(), StoreError> {
        match self {
            Change::Put(i) => store.put_group(&name(*i), &settings(*i)),
            Change::Drop(i) => store.drop_group(&name(*i)).map(drop),
            Change::Node(c) => store.set_node(node(*c)),
            Change::Meter(i, c) => store.put_meters(
                &[(name(*i), Meter { consumed: *c, admitted: 1, throttled: 2, waited: 3, would_refuse: 4 })],
                &[],
                60_000,
            ),
        }
    }

    fn expect(&self, stored: &mut Stored) {
        match self {
            Change::Put(i) => {
                stored.groups.insert(name(*i), settings(*i));
            }
            Change::Drop(i) => {
                stored.groups.remove(&name(*i));
                stored.meters.remove(&name(*i));
            }
            Change::Node(c) => {
                stored.node = node(*c);
                stored.node_stored = true;
            }
            Change::Meter(i, c) => {
                stored.meters.insert(
                    name(*i),
                    Meter { consumed: *c, admitted: 1, throttled: 2, waited: 3, would_refuse: 4 },
                );
            }
        }
    }
}

fn script() -> Vec<Change> {
    let mut changes: Vec<Change> = (0..6).map(Change::Put).collect();
    changes.extend([
        Change::Node(1000.0),
        Change::Meter(1, 42.0),
        Change::Drop(3),
        Change::Put(3),
        Change::Meter(4, 7.5),
    ]);
    changes.extend((6..10).map(Change::Put));
    changes
}

/// Runs the script on a store over `disk` until the first failure; returns the acknowledged
/// changes and the one that failed, if any.
fn run(disk: &FaultyDisk) -> (Vec<Change>, Option<Change>) {
    let Ok(mut store) = RedbStore::with_backend("faulty", disk.clone()) else { return (Vec::new(), None) };
    let mut acknowledged = Vec::new();
    for change in script() {
        match change.apply(&mut store) {
            Ok(()) => acknowledged.push(change),
            Err(_) => return (acknowledged, Some(change)),
        }
    }
    (acknowledged, None)
}

#[test]
fn every_acknowledged_write_survives_a_crash_at_every_point() {
    let clean = FaultyDisk::new(Vec::new(), u64::MAX, Fault::Crash);
    let (all, failed) = run(&clean);
    assert!(failed.is_none() && all.len() == script().len());
    let total = clean.ops();
    assert!(total > 20, "{total} operations");
    let mut checked = 0;
    for budget in 0..=total {
        let disk = FaultyDisk::new(Vec::new(), budget, Fault::Crash);
        let (acknowledged, failed) = run(&disk);
        // Start again on what reached the disk.
        let after = FaultyDisk::new(disk.bytes(), u64::MAX, Fault::Crash);
        let mut reopened = match RedbStore::with_backend("after a crash", after) {
            Ok(s) => s,
            Err(e) => {
                assert!(
                    acknowledged.is_empty(),
                    "crash after {budget} operations: {e}, with {} acknowledged",
                    acknowledged.len()
                );
                continue;
            }
        };
        let stored = reopened.load().unwrap_or_else(|e| panic!("crash after {budget} operations: {e}"));
        let mut expected = Stored::default();
        for change in &acknowledged {
            change.expect(&mut expected);
        }
        let mut with_failed = expected.clone();
        if let Some(change) = &failed {
            change.expect(&mut with_failed);
        }
        assert!(
            stored == expected || stored == with_failed,
            "crash after {budget} operations: {} acknowledged; stored {stored:?}",
            acknowledged.len()
        );
        if failed.is_some() && !acknowledged.is_empty() {
            checked += 1;
        }
    }
    assert!(checked > 10, "only {checked} crashes fell between acknowledged writes");
}

/// Regression: after one "No space left on device", every later write failed with "Previous I/O
/// error" until a restart, even once space was freed, and `/healthz` still said ok.
#[test]
fn a_full_disk_fails_writes_and_health_until_space_returns_then_recovers() {
    let disk = FaultyDisk::new(Vec::new(), u64::MAX, Fault::Full);
    let mut store = RedbStore::with_backend("full", disk.clone()).unwrap();
    store.put_group(&name(0), &settings(0)).unwrap();
    {
        let mut d = disk.disk();
        d.budget = d.ops;
    }
    let e = store.put_group(&name(1), &settings(1)).unwrap_err();
    assert!(e.is_transient(), "{e}");
    assert!(e.to_string().contains("No space left on device"), "{e}");
    assert!(store.health().is_some_and(|h| h.contains("No space left on device")));
    assert!(store.put_group(&name(2), &settings(2)).is_err(), "still full");
    disk.heal();
    store.put_group(&name(3), &settings(3)).unwrap();
    assert_eq!(store.health(), None);
    let stored = store.load().unwrap();
    assert!(stored.groups.contains_key(&name(0)) && stored.groups.contains_key(&name(3)));
    assert!(!stored.groups.contains_key(&name(1)) && !stored.groups.contains_key(&name(2)));
}

/// A change and its audit record are one write: the disk filling up at any point of an
/// audited change leaves both or neither, never the change alone (before, the record was a
/// second write, and a full disk between the two lost it while the change was acknowledged).
#[test]
fn a_change_and_its_audit_record_are_written_together_or_not_at_all() {
    let record = |i: u64| super::AuditRecord {
        at_unix_ms: 1_000 + i,
        who: "admin".into(),
        what: format!("group.put {}", name(i as usize)),
        before: None,
        after: Some("{}".into()),
    };
    let mut both = 0;
    let mut neither = 0;
    for budget in 0..200u64 {
        let disk = FaultyDisk::new(Vec::new(), u64::MAX, Fault::Full);
        let mut store = RedbStore::with_backend("audited", disk.clone()).unwrap();
        {
            let mut d = disk.disk();
            d.budget = d.ops + budget;
        }
        let acknowledged = store.audited(record(0)).put_group(&name(0), &settings(0)).is_ok();
        disk.heal();
        let stored = store.load().unwrap();
        let recorded = store.audit(0, 10).unwrap();
        let changed = stored.groups.contains_key(&name(0));
        // A write whose last sync failed may still have landed: unacknowledged, it may stand,
        // but acknowledged it must, and never without its record or the record without it.
        assert!(changed || !acknowledged, "budget {budget}: an acknowledged change was lost");
        assert_eq!(recorded.len(), usize::from(changed), "budget {budget}: {recorded:?}");
        if changed { both += 1 } else { neither += 1 }
    }
    assert!(both > 0 && neither > 0, "both {both}, neither {neither}");
}
