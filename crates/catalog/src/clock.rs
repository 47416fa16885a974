//! The clock and the writer identity every record jitship writes carries: one place, so records
//! from publish, gc and pin agree on both.

use std::time::{SystemTime, UNIX_EPOCH};

use jitship_generation::ContentHash;

/// Seconds since the Unix epoch (0 if the clock is before it).
pub fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Unique per write: host, pid and a random nonce. A record carries it so its writer can tell,
/// reading the record back, whether its own put won the key.
pub fn writer_id() -> String {
    let mut buf = [0u8; 16];
    // Without randomness the pid and the clock still make a writer unique on one host.
    let _ = getrandom::fill(&mut buf);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    buf.iter_mut()
        .zip(nanos.to_le_bytes())
        .for_each(|(b, x)| *b ^= x);
    format!(
        "{}/{}/{}",
        gethostname::gethostname().to_string_lossy(),
        std::process::id(),
        ContentHash::of(&buf).to_hex().get(..16).unwrap_or_default()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writer_ids_differ_per_call() {
        assert_ne!(writer_id(), writer_id());
    }
}
