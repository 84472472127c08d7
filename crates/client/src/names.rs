//! The table of names to groups that admission by name looks in.
//!
//! A hash table of its own rather than a `HashMap<GroupName, _>`, for what a look-up by name
//! waits for with a thousand names or more, taken in turn. A slot is 16 bytes: the name's
//! full hash and the group, no name. The group holds its own name, which a look-up compares
//! once the hash matched: so a look-up reads the table's compact control bytes and slots (a
//! thousand names' worth fits the core's first cache), then the group. With the names in the
//! slots (24 bytes each, 32 a slot), the slots themselves fell out of the first cache, and an
//! admission waited for its slot, then for its group.
//!
//! A name of up to 16 bytes is compared as a [`ShortName`], which the group keeps on the same
//! cache line as everything else an admission reads: with ten thousand groups or more, out of
//! the core's second cache, an admission by name then waits for one line of its group, not
//! two. Longer names are compared in full.
//!
//! The name is hashed as its bytes alone (a `str`'s `Hash` adds a terminator, one more round
//! of the hash), and compared in a few word loads inline, where `str`'s equality calls the C
//! library's `memcmp`.

use std::hash::{BuildHasher, Hasher};

use hashbrown::HashTable;
use tollgate_model::settings::GroupName;

/// What the table holds: something with a name, its key.
pub(crate) trait HasName {
    /// The name it is found by.
    fn name(&self) -> &GroupName;

    /// The name as [`ShortName::of`] gives it (kept beside what else is read with it).
    fn short_name(&self) -> ShortName;
}

/// A name of 1 to 16 bytes in 17: its length and 16 bytes that, with the length, tell it
/// from every other name of up to 16 bytes (see [`ShortKey`]). Longer names are all
/// [`ShortName::LONG`], compared in full.
///
/// Aligned to one byte, so that a group can keep it in the 17 bytes its hot line has left.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct ShortName {
    len: u8,
    bytes: [u8; 16],
}

impl ShortName {
    /// Any name of more than 16 bytes.
    const LONG: ShortName = ShortName { len: 0, bytes: [0; 16] };

    /// The short form of `name`, or [`ShortName::LONG`].
    pub(crate) fn of(name: &str) -> ShortName {
        match ShortKey::of(name) {
            Some(k) => {
                let mut bytes = [0; 16];
                bytes[..8].copy_from_slice(&k.lo.to_ne_bytes());
                bytes[8..].copy_from_slice(&k.hi.to_ne_bytes());
                ShortName { len: k.len as u8, bytes }
            }
            None => ShortName::LONG,
        }
    }

    /// Whether this is the short form of the name `key` was made from: two word comparisons
    /// and a byte's.
    #[inline(always)]
    fn is(&self, key: &ShortKey) -> bool {
        let word = |at: usize| u64::from_ne_bytes(self.bytes[at..at + 8].try_into().expect("eight bytes"));
        u64::from(self.len) == key.len && word(0) == key.lo && word(8) == key.hi
    }
}

/// A name of 1 to 16 bytes as a look-up holds it, in three words: its length, and two
/// words that cover every byte. The first and the last eight bytes (overlapping) for 8 to 16
/// bytes, the first and last four for 4 to 7, the first, middle and last bytes for 1 to 3:
/// two names of the same length are the same when their words are.
#[derive(Clone, Copy, Debug)]
struct ShortKey {
    len: u64,
    lo: u64,
    hi: u64,
}

impl ShortKey {
    /// `name`'s words, or `None` when it is empty or longer than 16 bytes. Read in a few
    /// loads of the name, with no copy.
    #[inline(always)]
    fn of(name: &str) -> Option<ShortKey> {
        let b = name.as_bytes();
        let n = b.len();
        let word = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("eight bytes"));
        let half = |at: usize| u64::from(u32::from_le_bytes(b[at..at + 4].try_into().expect("four bytes")));
        let (lo, hi) = match n {
            8..=16 => (word(0), word(n - 8)),
            4..=7 => (half(0) | half(n - 4) << 32, 0),
            1..=3 => (u64::from(b[0]) | u64::from(b[n / 2]) << 8 | u64::from(b[n - 1]) << 16, 0),
            _ => return None,
        };
        Some(ShortKey { len: n as u64, lo, hi })
    }
}

/// One group and its name's hash.
#[derive(Clone)]
struct Slot<G> {
    hash: u64,
    group: G,
}

/// A table keyed by group name, hashed with foldhash and seeded per table as [`NameMap`] is: a
/// remote client's exchange looks up every group it reports and every grant it takes, so for a
/// client of many groups hashing is much of an exchange's cost, and foldhash takes a fraction
/// of std's SipHash time on names this short.
pub(crate) type ByName<V> = std::collections::HashMap<GroupName, V, foldhash::fast::RandomState>;

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
        let Some(key) = ShortKey::of(name) else { return self.group_long(hash, name) };
        // The full hash first: another name's group is practically never read. Then the
        // short form, on the group's hot line.
        let slot = self.table.find(hash, |s| s.hash == hash && s.group.short_name().is(&key))?;
        Some(&slot.group)
    }

    /// [`group`](Self::group) for a name of more than 16 bytes, compared in full.
    #[inline(never)]
    fn group_long(&self, hash: u64, name: &str) -> Option<&G> {
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

        fn short_name(&self) -> ShortName {
            ShortName::of(self.0.as_str())
        }
    }

    #[test]
    fn short_forms_are_the_same_only_for_the_same_name_of_up_to_16_bytes() {
        // Every name of 0 to 20 bytes over a two-letter alphabet up to 6 bytes, and names
        // differing in one byte anywhere beyond.
        let mut names: Vec<String> = vec![String::new()];
        for len in 1..=6u32 {
            for bits in 0..1u32 << len {
                names.push((0..len).map(|i| if bits >> i & 1 == 1 { 'b' } else { 'a' }).collect());
            }
        }
        let base: String = (0..20u8).map(|i| char::from(b'a' + i)).collect();
        for len in 7..=20 {
            names.push(base[..len].to_string());
            for at in 0..len {
                let mut b = base.as_bytes()[..len].to_vec();
                b[at] = b'-';
                names.push(String::from_utf8(b).unwrap());
            }
        }
        for a in &names {
            let short = ShortName::of(a);
            let long = a.is_empty() || a.len() > 16;
            assert_eq!(short == ShortName::LONG, long, "{a:?}");
            assert_eq!(ShortKey::of(a).is_none(), long, "{a:?}");
            for b in &names {
                if let Some(key) = ShortKey::of(b) {
                    assert_eq!(short.is(&key), a == b, "{a:?} and {b:?}");
                }
            }
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
