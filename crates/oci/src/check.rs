//! The files of a generation checked against their blake3, from its packs in memory or spooled
//! to files: a pack's id names its layout, not its bytes, so the files are what prove them.

use std::fs::File;
use std::os::unix::fs::FileExt;

use jitship_generation::{ContentHasher, Manifest};

/// Every file of `manifest` read from `packs` (its packs' bytes, in order; `None` for a pack not
/// read, whose files are not checked) hashes to its blake3: a pack's id names its layout, not
/// its bytes, so the files are what prove them.
pub fn check_files(manifest: &Manifest, packs: &[Option<&[u8]>]) -> Result<(), String> {
    for (p, bytes) in manifest.packs.iter().zip(packs) {
        let Some(bytes) = bytes else { continue };
        if bytes.len() as u64 != p.size {
            return Err(format!(
                "pack {} is {} bytes, the manifest says {}",
                p.id,
                bytes.len(),
                p.size
            ));
        }
    }
    'files: for f in &manifest.files {
        let mut h = ContentHasher::new();
        for c in &f.chunks {
            let Some(pack) = packs[c.pack as usize] else {
                continue 'files;
            };
            // In bounds: `Manifest::validate` checked every chunk against its pack's size.
            let start = c.offset as usize;
            h.update(&pack[start..start + c.len as usize]);
        }
        if h.finish() != f.blake3 {
            return Err(format!("{} does not hash to its blake3 (altered)", f.path));
        }
    }
    Ok(())
}

/// [`check_files`] of packs spooled to files (`None`: not read, its files not checked), each
/// chunk read where it lies, so memory holds one buffer whatever the packs weigh.
pub fn check_spooled_files(manifest: &Manifest, packs: &[Option<&File>]) -> Result<(), String> {
    let unreadable =
        |p: usize, e: std::io::Error| format!("reading back pack {}: {e}", manifest.packs[p].id);
    for (i, (p, file)) in manifest.packs.iter().zip(packs).enumerate() {
        let Some(file) = file else { continue };
        let len = file.metadata().map_err(|e| unreadable(i, e))?.len();
        if len != p.size {
            return Err(format!(
                "pack {} is {len} bytes, the manifest says {}",
                p.id, p.size
            ));
        }
    }
    let mut buf = vec![0u8; 1 << 20];
    'files: for f in &manifest.files {
        let mut h = ContentHasher::new();
        for c in &f.chunks {
            let Some(pack) = packs[c.pack as usize] else {
                continue 'files;
            };
            // In bounds: `Manifest::validate` checked every chunk against its pack's size.
            let (mut at, end) = (c.offset, c.offset + c.len);
            while at < end {
                let n = ((end - at) as usize).min(buf.len());
                pack.read_exact_at(&mut buf[..n], at)
                    .map_err(|e| unreadable(c.pack as usize, e))?;
                h.update(&buf[..n]);
                at += n as u64;
            }
        }
        if h.finish() != f.blake3 {
            return Err(format!("{} does not hash to its blake3 (altered)", f.path));
        }
    }
    Ok(())
}
