//! TorchInductor trees (research/jit-caches.md §1.2, research/inductor-cpu.md §6).
//!
//! Inductor writes its entries (`fxgraph/`, `aotautograd/`, generated `.py`/`.cpp`,
//! `.best_config`, `cache/<system hash>`) with `write_atomic` (`.<pid>.<tid>.tmp` + rename), so a
//! present file is complete. The exceptions are shared objects, which g++/ld write in place under
//! `locks/<key>.lock`: a `.so` counts only when its ELF headers are in place. Triton kernels under
//! `triton/<device>/<hash>/` follow the Triton group rule (their group files embed the root).
//! `locks/`, `*_CxxBuild/` and temp files are never published.
//!
//! Markers (research/inductor-cpu.md §6.1-6.2): Inductor finds everything else through the
//! `fxgraph/` and `aotautograd/` entries (a hit there loads the wrapper and its kernels), and
//! trusts a kernel `.so` without re-probing it once its `.so.load_ok` exists. An install commits
//! these last, so a worker never hits an entry whose kernels are not in place yet.

use jitship_policy_sdk::{Decision, FileEntry, Host, ReasonCategory, file_name};

use crate::check::elf_complete;
use crate::{Decisions, triton};

/// Decides the undecided entries among `candidates` (indices into `entries`) under `base` ("" or
/// a directory ending with '/') as an Inductor cache directory; `root` is the absolute root the
/// entries live under.
pub fn decide(
    host: &dyn Host,
    root: &str,
    entries: &[FileEntry],
    candidates: impl IntoIterator<Item = usize>,
    base: &str,
    out: &mut Decisions,
) {
    let mut kernels = Vec::new();
    for i in candidates {
        let Some(e) = entries.get(i) else { continue };
        if out.is_decided(i) {
            continue;
        }
        let Some(rel) = e.path.strip_prefix(base) else {
            continue;
        };
        let parts: Vec<&str> = rel.split('/').collect();
        if parts[0] == "triton" {
            if parts.len() == 4 {
                kernels.push(triton::KernelFile {
                    index: i,
                    kernel_dir: format!("{base}triton/{}/{}", parts[1], parts[2]),
                    name: parts[3].to_string(),
                });
            } else {
                out.set(
                    i,
                    Decision::skip(
                        ReasonCategory::NotCache,
                        "unexpected path in Inductor's triton/<device>/<hash>/ tree",
                    ),
                );
            }
        } else if file_name(rel).ends_with(".so") {
            out.set(
                i,
                match elf_complete(host, e) {
                    Ok(()) => Decision::publish("shared object complete (ELF headers in place)"),
                    Err(why) => Decision::skip(ReasonCategory::Incomplete, why),
                },
            );
        } else if is_marker(parts[0], rel) {
            out.set(
                i,
                Decision::publish(
                    "written atomically by Inductor; Inductor finds others through it",
                )
                .marker(),
            );
        } else {
            out.set(i, Decision::publish("written atomically by Inductor"));
        }
    }
    triton::decide(host, root, entries, &kernels, out);
}

/// Whether the file at `rel` (first component `top`) is how Inductor finds other files: an FX
/// graph or AOTAutograd entry, or a `.so.load_ok` dlopen-probe marker.
fn is_marker(top: &str, rel: &str) -> bool {
    top == "fxgraph" || top == "aotautograd" || rel.ends_with(".so.load_ok")
}
