//! gc of the durable registry tier: retention's drops applied to the OCI registry.

use serde::Serialize;

use super::report::{GcReport, Verdict};

/// What gc did to the durable registry tier: the manifest of every generation retention
/// dropped, deleted by digest (its tags go with it; the registry's own garbage collection frees
/// the blobs).
#[derive(Debug, Clone, Default, Serialize)]
pub struct RegistryGc {
    pub registry: String,
    /// Tags of the generations deleted (in a dry run: that would be, if the registry has them).
    pub deleted: Vec<String>,
    /// Dropped generations the registry did not hold.
    pub absent: u64,
    /// Deletes that failed (the generation stays in the registry; the next gc does not see it
    /// again, since the store no longer holds it: delete it with the registry's tools).
    pub errors: Vec<String>,
}

/// Retention decides once, for the store (`collect`); this applies its drops to the durable
/// registry tier. Only generations retention dropped are deleted: a generation the store does not
/// hold at all (lost to a master restart, say) is never judged by gc, so it stays.
pub fn collect_registry(
    registry: &crate::oci::Registry,
    report: &GcReport,
    deadline: std::time::Instant,
) -> RegistryGc {
    let mut gc = RegistryGc {
        registry: registry.describe(),
        ..RegistryGc::default()
    };
    for d in report
        .decisions
        .iter()
        .filter(|d| d.verdict == Verdict::Drop)
    {
        for &seq in &d.seqs {
            let tag = crate::oci::Registry::generation_tag(&d.compat_id, seq, &d.generation);
            if report.dry_run {
                gc.deleted.push(tag);
                continue;
            }
            match registry.delete_generation(&d.compat_id, seq, &d.generation, deadline) {
                Ok(true) => gc.deleted.push(tag),
                Ok(false) => gc.absent += 1,
                Err(e) => gc.errors.push(format!("{tag}: {e}")),
            }
        }
    }
    gc
}
