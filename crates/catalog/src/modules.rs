//! Policy modules in the store, by digest (`{ns}/module/{blake3}`). Publish stores the module it
//! used beside the generation; the manifest names it by its blake3 (`Manifest.policy.digest`), so
//! the head's signature, which covers the manifest, covers the module too. gc, `inspect` and
//! `policy test` fetch it from here when no local file has that digest (a rebuilt or deleted
//! module), and gc removes the modules no retained manifest names.
//!
//! Anyone can write the store: a module key is hostile input until its bytes hash to the digest
//! its key names. Reads are capped at [`MAX_MODULE_BYTES`]; bytes that do not match are refused
//! (`ModuleRead::Refused`), never loaded. A key someone else wrote first with other bytes (puts
//! never overwrite) is removed and written again by publish (`put_module`).

use jitship_generation::ContentHash;
use jitship_store::{Store, StoreError, ValueClass};

use crate::KeyLayout;

/// Largest module stored or read (the built-in modules are 80 to 200 KiB).
pub const MAX_MODULE_BYTES: u64 = 16 * 1024 * 1024;

/// What reading a module by digest found.
#[derive(Debug)]
pub enum ModuleRead {
    /// The bytes, whose blake3 is the digest asked for.
    Present(Vec<u8>),
    Missing,
    /// The key holds something that is not that module (other bytes, over the cap): why.
    Refused(String),
}

/// Reads the module of `digest`, checked against it. Only the store failing is an error.
pub fn read_module(
    store: &dyn Store,
    layout: &KeyLayout,
    digest: &ContentHash,
) -> Result<ModuleRead, StoreError> {
    let key = layout.module(digest);
    let bytes = match store.get_capped(&key, MAX_MODULE_BYTES) {
        Ok(Some(b)) => b,
        Ok(None) => return Ok(ModuleRead::Missing),
        Err(StoreError::TooLarge { size, limit }) => {
            return Ok(ModuleRead::Refused(format!(
                "{key} holds {size} bytes, over the {limit}-byte cap on modules"
            )));
        }
        Err(e) => return Err(e),
    };
    let actual = ContentHash::of(&bytes);
    if actual != *digest {
        return Ok(ModuleRead::Refused(format!(
            "{key} holds bytes whose blake3 is {actual}, not the digest its key names \
             (anyone can write the store)"
        )));
    }
    Ok(ModuleRead::Present(bytes))
}

/// What `put_module` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModulePut {
    /// Written now.
    Written,
    /// Already there, with these very bytes.
    Present,
    /// The key held other bytes and could not be replaced: why (the generation is published all
    /// the same; gc keeps its key whole until a module with its digest is at hand).
    Refused(String),
}

/// Stores `bytes` under their digest unless the store already holds exactly them. A key holding
/// other bytes (someone wrote it first) is removed and written again, once.
pub fn put_module(
    store: &dyn Store,
    layout: &KeyLayout,
    bytes: &[u8],
) -> Result<ModulePut, StoreError> {
    if bytes.len() as u64 > MAX_MODULE_BYTES {
        return Ok(ModulePut::Refused(format!(
            "the module is {} bytes, over the {MAX_MODULE_BYTES}-byte cap on stored modules",
            bytes.len()
        )));
    }
    let digest = ContentHash::of(bytes);
    let key = layout.module(&digest);
    let existed = store.exists(&key)?;
    if existed {
        match read_module(store, layout, &digest)? {
            ModuleRead::Present(_) => return Ok(ModulePut::Present),
            ModuleRead::Missing => {}
            ModuleRead::Refused(why) => {
                tracing::warn!(key = %key, "replacing a stored module that is not its digest's: {why}");
                store.remove(&key)?;
            }
        }
    }
    store.put(&key, bytes, ValueClass::Record)?;
    match read_module(store, layout, &digest)? {
        ModuleRead::Present(_) => Ok(ModulePut::Written),
        ModuleRead::Missing => Ok(ModulePut::Refused(format!(
            "{key} was gone right after it was written (evicted?)"
        ))),
        ModuleRead::Refused(why) => Ok(ModulePut::Refused(why)),
    }
}
