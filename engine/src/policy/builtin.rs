//! Built-in policies embedded in the binary, by cache kind.
//!
//! STUB owned by the `policies` branch, which replaces this file with the real table of embedded
//! `.wasm` modules built from `policies/*`. Until that lands every kind falls back to
//! `native::NativeRules` (see `host::PolicySet`). Keep the signature: the host calls only this.

/// The embedded component for `kind`, if jitship ships one.
pub fn lookup(kind: &str) -> Option<&'static [u8]> {
    let _ = kind;
    None
}
