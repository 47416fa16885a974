//! The one hashing helper: blake3, full width, hex on the wire. Nothing else in the workspace
//! names `blake3` (the root `clippy.toml` disallows it), so what a content hash is can change in
//! this file.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

use std::fmt;
use std::io::Read;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A blake3 digest of some bytes (a file's content, a canonical manifest, a pack descriptor).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ContentHash(pub [u8; 32]);

impl ContentHash {
    pub fn of(bytes: &[u8]) -> Self {
        Self(*blake3::hash(bytes).as_bytes())
    }

    /// The first `n` hex digits (at most 64), for names and short ids.
    pub fn short_hex(&self, n: usize) -> String {
        let mut hex = self.to_hex();
        hex.truncate(n);
        hex
    }

    /// The hash of `value`'s JSON, hashed as it is written: the bytes are never held whole (a
    /// manifest of 20,000 files is 4 MB). Buffered, because the serializer writes token by token.
    pub fn of_json<T: serde::Serialize + ?Sized>(value: &T) -> Self {
        let mut writer = std::io::BufWriter::with_capacity(64 * 1024, ContentHasher::new());
        serde_json::to_writer(&mut writer, value)
            .expect("serializing into a hasher cannot fail: it has no I/O error");
        let hasher = writer
            .into_inner()
            .unwrap_or_else(|_| unreachable!("flushing into a hasher cannot fail"));
        hasher.finish()
    }

    pub fn to_hex(&self) -> String {
        blake3::Hash::from_bytes(self.0).to_hex().to_string()
    }
}

impl From<blake3::Hash> for ContentHash {
    fn from(h: blake3::Hash) -> Self {
        Self(*h.as_bytes())
    }
}

/// A content hash computed from bytes given in pieces (a file read in chunks, a file spread over
/// packs, records written field by field): `finish` equals `ContentHash::of` of the pieces joined.
#[derive(Clone, Default)]
pub struct ContentHasher(blake3::Hasher);

impl ContentHasher {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn update(&mut self, bytes: &[u8]) -> &mut Self {
        self.0.update(bytes);
        self
    }

    pub fn finish(&self) -> ContentHash {
        self.0.finalize().into()
    }
}

impl std::io::Write for ContentHasher {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl fmt::Display for ContentHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for ContentHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ContentHash({})", self.to_hex())
    }
}

impl FromStr for ContentHash {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s.len() != 64
            || !s
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err(format!("not a 64-digit lowercase hex blake3 hash: {s:?}"));
        }
        blake3::Hash::from_hex(s)
            .map(Into::into)
            .map_err(|e| e.to_string())
    }
}

impl Serialize for ContentHash {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // From the stack: a manifest serializes tens of thousands of these.
        s.serialize_str(blake3::Hash::from_bytes(self.0).to_hex().as_str())
    }
}

impl<'de> Deserialize<'de> for ContentHash {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // Parsed from the deserializer's own buffer, without a `String` per hash: decoding a
        // manifest reads tens of thousands of them.
        struct Hex;
        impl serde::de::Visitor<'_> for Hex {
            type Value = ContentHash;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a 64-digit lowercase hex blake3 hash")
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<ContentHash, E> {
                s.parse().map_err(E::custom)
            }
        }
        d.deserialize_str(Hex)
    }
}

/// Streams an open file (opened beneath a directory descriptor: no path is followed here)
/// through blake3 with a fixed, per-thread buffer (memory stays bounded whatever the size, and
/// hashing many small files does not pay for a fresh buffer each time).
/// Returns the hash and the number of bytes read.
pub fn hash_open_file(file: &mut std::fs::File) -> std::io::Result<(ContentHash, u64)> {
    thread_local! {
        static BUFFER: std::cell::RefCell<Vec<u8>> = std::cell::RefCell::new(vec![0u8; 256 * 1024]);
    }
    let mut hasher = ContentHasher::new();
    let mut total = 0u64;
    BUFFER.with_borrow_mut(|buf| {
        loop {
            let n = match file.read(buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            hasher.update(&buf[..n]);
            total += n as u64;
        }
        Ok(())
    })?;
    Ok((hasher.finish(), total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trip_and_rejects_junk() {
        let h = ContentHash::of(b"abc");
        assert_eq!(h.to_hex().parse::<ContentHash>().unwrap(), h);
        assert!("xyz".parse::<ContentHash>().is_err());
        assert!(h.to_hex().to_uppercase().parse::<ContentHash>().is_err());
    }

    #[test]
    fn file_hash_matches_in_memory_hash() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let data = vec![7u8; 1_000_003];
        std::fs::write(&p, &data).unwrap();
        assert_eq!(
            hash_open_file(&mut std::fs::File::open(&p).unwrap()).unwrap(),
            (ContentHash::of(&data), data.len() as u64)
        );
    }
}
