//! The table of names to groups that admission by name looks in.
//!
//! A hash table of its own rather than a `HashMap<GroupName, _>`, for what a look-up by name
//! waits for with a thousand names or more, taken in turn. A slot is 16 bytes: the name's
//! full hash and the group, no name. The group holds its own name, which a look-up compares
//! once the hash matched, on the group's first line: so a look-up reads the table's compact
//! control bytes and slots (a thousand names' worth fits the core's first cache), then the
//! group, whose first line (the name) and second (what an admission reads) the processor
//! fetches together. With the names in the slots (24 bytes each, 32 a slot), the slots
//! themselves fell out of the first cache, and an admission waited for its slot, then for
//! its group.
//!
//! The name is hashed as its bytes alone (a `str`'s `Hash` adds a terminator, one more round
//! of the hash), and compared in a few word loads inline, where `str`'s equality calls the C
//! library's `memcmp`.

use std::hash::{BuildHasher, Hasher};

use hashbrown::HashTable;
use tollgate_core::settings::GroupName;

/// What the table holds: something with a name, its key.
pub(crate) trait HasName {
    /// The name it is found by.
    fn name(&self) -> &GroupName;
}

/// One group and its name's hash.
#[derive(Clone)]
struct Slot<G> {
    hash: u64,
    group: G,
}

/// Names to groups, hashed with foldhash (seeded per table, so names a client picks cannot be
/// chosen to collide).
#[derive(Clone)]
pub(crate) struct NameMap<G> {
    table: HashTable<Slot<G>>,
    state: foldhash::fast::RandomState,
}

impl<G> Default for NameMap<G> {
    fn default() -> Self {
        Self { table: HashTable::new(), state: foldhash::fast::RandomState::default() }
    }
}

impl<G: HasName> NameMap<G> {
    /// `name` hashed as its bytes alone.
    #[inline(always)]
    fn hash(&self, name: &str) -> u64 {
        let mut h = self.state.build_hasher();
        h.write(name.as_bytes());
        h.finish()
    }

    /// The group named `name`.
    #[inline(always)]
    pub(crate) fn group(&self, name: &str) -> Option<&G> {
        let hash = self.hash(name);
        // The full hash first: another name's group is practically never read.
        let slot = self.table.find(hash, |s| s.hash == hash && same_name(s.group.name().as_str(), name))?;
        Some(&slot.group)
    }

    /// Puts `group` in under its name, in place of any group of that name.
    pub(crate) fn insert(&mut self, group: G) {
        let hash = self.hash(group.name().as_str());
        let found = |s: &Slot<G>| s.hash == hash && s.group.name() == group.name();
        match self.table.entry(hash, found, |s| s.hash) {
            hashbrown::hash_table::Entry::Occupied(mut o) => o.get_mut().group = group,
            hashbrown::hash_table::Entry::Vacant(v) => {
                v.insert(Slot { hash, group });
            }
        }
    }

    /// Moves every group of `other` in.
    pub(crate) fn take_all(&mut self, other: &mut NameMap<G>) {
        self.table.reserve(other.len(), |s| s.hash);
        for s in other.table.drain() {
            self.insert(s.group);
        }
    }

    /// How many names it holds.
    pub(crate) fn len(&self) -> usize {
        self.table.len()
    }

    /// Every group, in no order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &G> {
        self.table.iter().map(|s| &s.group)
    }
}

/// Whether two names are the same, inline: names are short, and a call to `memcmp` cost more
/// than the comparison. Lengths first, then overlapping eight-byte words.
#[inline(always)]
fn same_name(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let n = a.len();
    if n != b.len() {
        return false;
    }
    if !(8..=32).contains(&n) {
        return a == b;
    }
    let word = |s: &[u8], at: usize| u64::from_ne_bytes(s[at..at + 8].try_into().expect("eight bytes"));
    let mut at = 0;
    while at + 8 < n {
        if word(a, at) != word(b, at) {
            return false;
        }
        at += 8;
    }
    word(a, n - 8) == word(b, n - 8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_compare_equal_only_when_every_byte_is_the_same() {
        let base: String = (0..40u8).map(|i| char::from(b'a' + i % 26)).collect();
        for len in 0..=40 {
            let a = &base[..len];
            assert!(same_name(a, a));
            let copy = String::from(a);
            assert!(same_name(a, &copy));
            // One byte changed anywhere, and one byte more or less.
            for at in 0..len {
                let mut b = a.as_bytes().to_vec();
                b[at] = b'-';
                assert!(!same_name(a, std::str::from_utf8(&b).unwrap()), "len {len}, byte {at}");
            }
            if len < 40 {
                assert!(!same_name(a, &base[..len + 1]));
            }
            if len > 0 {
                assert!(!same_name(a, &base[..len - 1]));
            }
        }
    }

    impl HasName for (GroupName, i32) {
        fn name(&self) -> &GroupName {
            &self.0
        }
    }

    fn named(name: &str, value: i32) -> (GroupName, i32) {
        (GroupName::new(name).unwrap(), value)
    }

    #[test]
    fn a_name_finds_what_was_put_in_for_it_last_and_moving_keeps_every_name() {
        let mut map = NameMap::default();
        for i in 0..1000 {
            map.insert(named(&format!("tenant-{i}"), i));
        }
        map.insert(named("tenant-7", 7000));
        assert_eq!(map.len(), 1000);
        assert_eq!(map.group("tenant-7").map(|g| g.1), Some(7000));
        assert_eq!(map.group("tenant-999").map(|g| g.1), Some(999));
        assert_eq!(map.group("tenant-1000"), None);
        let long = "a-name-longer-than-thirty-two-bytes-held-elsewhere";
        let mut other = NameMap::default();
        other.insert(named(long, -1));
        other.insert(named("tenant-8", 8000));
        map.take_all(&mut other);
        assert_eq!((map.len(), other.len()), (1001, 0));
        assert_eq!(map.group(long).map(|g| g.1), Some(-1));
        assert_eq!(map.group("tenant-8").map(|g| g.1), Some(8000));
        assert_eq!(map.iter().filter(|g| g.0.as_str().starts_with("tenant-")).count(), 1000);
    }
}
