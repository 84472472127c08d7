//! Checksums on the data file's records: every value the embedded store writes carries, after
//! it, the first [`SEAL_BYTES`] bytes of the SHA-256 of its key and itself. A bit flipped
//! anywhere in a record (key or value) then fails its check when the file is read at start, and
//! the start is refused naming the record, with the file left as it was; a damaged record is
//! never served as a setting.
//!
//! Files written before records carried checksums hold none: the first start that opens such
//! a file for writing seals every record in one transaction and marks the file ([`FORMAT`]),
//! and from then on every record must carry its checksum.

use redb::TableDefinition;

/// The bytes of a record's checksum.
pub const SEAL_BYTES: usize = 8;

/// The file's format marks: [`SEALED`] once every record carries its checksum.
pub(super) const FORMAT: TableDefinition<&str, u64> = TableDefinition::new("format");
/// The mark of a file whose records all carry checksums.
pub(super) const SEALED: &str = "sealed";

fn digest(key: &[u8], payload: &[u8]) -> [u8; SEAL_BYTES] {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    // The key's length first, so that no key and value split the same bytes two ways.
    ctx.update(&(key.len() as u64).to_le_bytes());
    ctx.update(key);
    ctx.update(payload);
    let d = ctx.finish();
    let mut out = [0u8; SEAL_BYTES];
    out.copy_from_slice(&d.as_ref()[..SEAL_BYTES]);
    out
}

/// `payload` with its checksum after it, as stored under `key`.
pub(super) fn seal(key: &[u8], payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + SEAL_BYTES);
    out.extend_from_slice(payload);
    out.extend_from_slice(&digest(key, payload));
    out
}

/// The payload of a record stored under `key`, once its checksum holds.
pub(super) fn unseal<'v>(key: &[u8], value: &'v [u8]) -> Result<&'v [u8], String> {
    let Some(at) = value.len().checked_sub(SEAL_BYTES) else {
        return Err(format!("too short to carry its checksum ({} bytes): the file is damaged", value.len()));
    };
    let (payload, sum) = value.split_at(at);
    if digest(key, payload) != sum {
        return Err("its checksum does not match: the file is damaged".into());
    }
    Ok(payload)
}

/// The bytes a usage record's key is sealed with.
pub(super) fn usage_key(minute: u64, group: &str) -> Vec<u8> {
    let mut k = minute.to_be_bytes().to_vec();
    k.extend_from_slice(group.as_bytes());
    k
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_record_reads_back_and_any_flipped_bit_is_caught() {
        let (key, payload) = (b"acme".as_slice(), b"\x08\x64 some settings".as_slice());
        let sealed = seal(key, payload);
        assert_eq!(unseal(key, &sealed), Ok(payload));
        for bit in 0..sealed.len() * 8 {
            let mut flipped = sealed.clone();
            flipped[bit / 8] ^= 1 << (bit % 8);
            assert!(unseal(key, &flipped).is_err(), "bit {bit} flipped in the value");
        }
        for bit in 0..key.len() * 8 {
            let mut k = key.to_vec();
            k[bit / 8] ^= 1 << (bit % 8);
            assert!(unseal(&k, &sealed).is_err(), "bit {bit} flipped in the key");
        }
        assert!(unseal(key, &sealed[..3]).unwrap_err().contains("too short"));
        // Another key's record does not pass as this one's.
        assert!(unseal(b"acm", &seal(b"acme", b"x")).is_err());
    }
}
