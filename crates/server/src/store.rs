//! Durable settings: groups and node capacity in an embedded database file (redb).
//!
//! A change is written and committed (redb's default durability: flushed to disk) before it
//! is acknowledged. Values are the contract's own messages, encoded with prost, so the file
//! format is versioned with the contract. A file another process holds, or one that cannot
//! be read, is an error at start, never a silent reset.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use prost::Message;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use thiserror::Error;
use tollgate_core::settings::{GroupName, GroupSettings};
use tollgate_proto::v1;

use crate::convert;

const GROUPS: TableDefinition<&str, &[u8]> = TableDefinition::new("groups");
const NODE: TableDefinition<&str, &[u8]> = TableDefinition::new("node");
const NODE_KEY: &str = "node";
/// The database file's name inside the data directory.
pub const FILE_NAME: &str = "tollgate.redb";

/// Why the store failed.
#[derive(Debug, Error)]
pub enum StoreError {
    /// The data directory could not be created or used.
    #[error("cannot use data directory {path}: {source}")]
    Directory {
        /// The directory.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// Another process has the file open.
    #[error("data file {path} is in use by another process (is another tollgate server running?)")]
    Locked {
        /// The file.
        path: PathBuf,
    },
    /// The file could not be opened or read: corrupt, or not a Tollgate data file.
    #[error("data file {path} cannot be opened: {reason}")]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// A stored record does not decode.
    #[error("data file {path}: stored {what} is corrupt: {reason}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// Which record.
        what: String,
        /// What went wrong.
        reason: String,
    },
    /// A read or write failed.
    #[error("data file {path}: {reason}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
}

impl StoreError {
    /// Whether retrying may help (a failed write may succeed later; a corrupt file won't).
    pub fn is_transient(&self) -> bool {
        matches!(self, StoreError::Io { .. })
    }
}

/// The settings store.
pub struct Store {
    db: Database,
    path: PathBuf,
}

/// What the store holds.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stored {
    /// Groups by name.
    pub groups: BTreeMap<GroupName, GroupSettings>,
    /// Node capacity, units/s.
    pub capacity: Option<f64>,
}

impl Store {
    /// Opens (creating if need be) the store in `dir`.
    pub fn open(dir: &Path) -> Result<Store, StoreError> {
        std::fs::create_dir_all(dir)
            .map_err(|source| StoreError::Directory { path: dir.to_path_buf(), source })?;
        let path = dir.join(FILE_NAME);
        let db = Database::create(&path).map_err(|e| match e {
            redb::DatabaseError::DatabaseAlreadyOpen => StoreError::Locked { path: path.clone() },
            other => StoreError::Unreadable { path: path.clone(), reason: other.to_string() },
        })?;
        let store = Store { db, path };
        // Create the tables so that reads of a new store find them.
        store.write(|txn| {
            txn.open_table(GROUPS)?;
            txn.open_table(NODE)?;
            Ok(())
        })?;
        Ok(store)
    }

    fn io(&self, e: impl std::fmt::Display) -> StoreError {
        StoreError::Io { path: self.path.clone(), reason: e.to_string() }
    }

    fn write(
        &self,
        f: impl FnOnce(&redb::WriteTransaction) -> Result<(), redb::Error>,
    ) -> Result<(), StoreError> {
        let txn = self.db.begin_write().map_err(|e| self.io(e))?;
        f(&txn).map_err(|e| self.io(e))?;
        txn.commit().map_err(|e| self.io(e))
    }

    /// Everything stored.
    pub fn load(&self) -> Result<Stored, StoreError> {
        let txn = self.db.begin_read().map_err(|e| self.io(e))?;
        let mut out = Stored::default();
        let groups = txn.open_table(GROUPS).map_err(|e| self.io(e))?;
        for entry in groups.iter().map_err(|e| self.io(e))? {
            let (k, v) = entry.map_err(|e| self.io(e))?;
            let corrupt = |reason: String| StoreError::Corrupt {
                path: self.path.clone(),
                what: format!("group {:?}", k.value()),
                reason,
            };
            let name = GroupName::new(k.value()).map_err(|e| corrupt(e.to_string()))?;
            let msg = v1::GroupSettings::decode(v.value()).map_err(|e| corrupt(e.to_string()))?;
            let settings = convert::settings_from_proto(&msg).map_err(|e| corrupt(e.to_string()))?;
            out.groups.insert(name, settings);
        }
        let node = txn.open_table(NODE).map_err(|e| self.io(e))?;
        if let Some(v) = node.get(NODE_KEY).map_err(|e| self.io(e))? {
            let msg = v1::NodeInfo::decode(v.value()).map_err(|e| StoreError::Corrupt {
                path: self.path.clone(),
                what: "node settings".into(),
                reason: e.to_string(),
            })?;
            out.capacity = msg.capacity;
        }
        Ok(out)
    }

    /// Stores a group's settings (durably, before returning).
    pub fn put_group(&self, name: &GroupName, settings: &GroupSettings) -> Result<(), StoreError> {
        let bytes = convert::settings_to_proto(settings).encode_to_vec();
        self.write(|txn| {
            txn.open_table(GROUPS)?.insert(name.as_str(), bytes.as_slice())?;
            Ok(())
        })
    }

    /// Removes a group; says whether it was there.
    pub fn drop_group(&self, name: &GroupName) -> Result<bool, StoreError> {
        let mut existed = false;
        self.write(|txn| {
            existed = txn.open_table(GROUPS)?.remove(name.as_str())?.is_some();
            Ok(())
        })?;
        Ok(existed)
    }

    /// Stores the node capacity.
    pub fn set_capacity(&self, capacity: Option<f64>) -> Result<(), StoreError> {
        let bytes = v1::NodeInfo { capacity }.encode_to_vec();
        self.write(|txn| {
            txn.open_table(NODE)?.insert(NODE_KEY, bytes.as_slice())?;
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("tollgate-store-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn settings_survive_a_reopen() {
        let d = dir("reopen");
        let g = GroupName::new("a").unwrap();
        {
            let s = Store::open(&d).unwrap();
            s.put_group(&g, &GroupSettings::builder().reserved(5.0).limit(10.0).build().unwrap()).unwrap();
            s.set_capacity(Some(1000.0)).unwrap();
        }
        let s = Store::open(&d).unwrap();
        let stored = s.load().unwrap();
        assert_eq!(stored.capacity, Some(1000.0));
        assert_eq!(stored.groups[&g].reserved(), 5.0);
        assert!(s.drop_group(&g).unwrap());
        assert!(!s.drop_group(&g).unwrap());
        assert!(s.load().unwrap().groups.is_empty());
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_file_in_use_or_corrupt_is_a_clear_error() {
        let d = dir("locked");
        let first = Store::open(&d).unwrap();
        let e = Store::open(&d).err().expect("locked");
        assert!(e.to_string().contains("in use by another process"), "{e}");
        drop(first);
        std::fs::write(d.join(FILE_NAME), b"this is not a database").unwrap();
        let e = Store::open(&d).err().expect("corrupt");
        assert!(matches!(e, StoreError::Unreadable { .. }), "{e}");
        let _ = std::fs::remove_dir_all(&d);
    }
}
