//! Built-in policy for Inductor's precompiled headers (docs/inductor-cpu.md#precompiled-headers).
//!
//! * Root: `$TMPDIR/torchinductor_${USER}/precompiled_headers`. Inductor keeps it under its
//!   *default* cache directory whatever `TORCHINDUCTOR_CACHE_DIR` says, so it lives outside a
//!   moved Inductor root; installed, it lands in the consumer's own `$TMPDIR/torchinductor_$USER`.
//!   Without it a consumer rebuilds the 157 MB header on its first compiled call even on a full
//!   cache hit (about 11 s on 2 cores). When the Inductor root is the default directory itself,
//!   the `inductor` kind already carries `precompiled_headers/` and this kind is not needed.
//! * Complete: `c<key>.h` stubs (written atomically); `c<key>.h.gch` once GCC has written its
//!   identification over the `gpcWrite` placeholder (g++ writes the file in place and stamps it
//!   last). Never `locks/`.
//! * Key: the same as the `inductor` kind's (the header's own key holds the compiler's `-v`, the
//!   absolute include paths and the ISA flags).
//! * Retention: the newest 3.

use jitship_policy_common::inductor::{inductor_key, precompiled_header};
use jitship_policy_sdk::{
    Decision, Facts, FileEntry, Host, Policy, PolicyError, PolicyInfo, ReasonCategory,
    export_policy, never_publish,
};

#[derive(Default)]
pub struct InductorPch;

impl Policy for InductorPch {
    fn info(&self) -> PolicyInfo {
        PolicyInfo {
            name: "inductor-pch".into(),
            version: "1.0.0".into(),
            cache_kind: "inductor-pch".into(),
            default_root: "$TMPDIR/torchinductor_${USER}/precompiled_headers".into(),
            root_env: Vec::new(),
            description: "TorchInductor precompiled headers: .h stubs, .h.gch once g++ stamped them complete; keyed like the inductor kind".into(),
            settings: vec![],
        }
    }

    fn compat_key(&self, facts: &Facts) -> Result<String, PolicyError> {
        inductor_key("inductor-pch", facts)
    }

    fn select(
        &self,
        host: &dyn Host,
        _root: &str,
        entries: &[FileEntry],
    ) -> Result<Vec<Decision>, PolicyError> {
        Ok(entries
            .iter()
            .map(|e| match never_publish(&e.path) {
                Some(skip) => skip,
                None if e.path.contains('/') => Decision::skip(
                    ReasonCategory::NotCache,
                    "not an Inductor precompiled header (they sit at the top)",
                ),
                None => precompiled_header(host, e),
            })
            .collect())
    }
}

export_policy!(InductorPch);

#[cfg(test)]
mod tests {
    use super::*;
    use jitship_policy_common::inductor::KEY_FACTS;
    use jitship_policy_common::testing::{Tree, assert_paths};

    #[test]
    fn complete_headers_and_stubs_publish_the_rest_waits_or_is_skipped() {
        let t = Tree::new();
        t.file("cabc.h", b"#include <torch/csrc/inductor/cpp_prefix.h>\n")
            .file("cabc.h.gch", b"gpch+014\x18\xa4 156 MB of header")
            .file("cdef.h", b"#include <torch/csrc/inductor/cpp_prefix.h>\n")
            .file("cdef.h.gch", b"gpcWrite g++ still writing")
            .file("locks/cabc.lock", b"")
            .file("stray.txt", b"x")
            .file("sub/cx.h", b"x");
        assert_paths(
            &t.published(&InductorPch),
            &["cabc.h", "cabc.h.gch", "cdef.h"],
        );
        let sel = t.select(&InductorPch);
        assert!(sel["cdef.h.gch"].1.starts_with("incomplete: "));
        assert!(sel["cdef.h.gch"].1.contains("gpcWrite"));
        assert!(sel["locks/cabc.lock"].1.starts_with("lock: "));
        assert!(sel["stray.txt"].1.starts_with("not-cache: "));
        // Headers carry no notion of a complete cache: each one stands alone.
        assert!(t.selection(&InductorPch).complete);
    }

    #[test]
    fn keyed_like_inductor_on_a_cpu_machine() {
        let f = Facts::from_pairs(KEY_FACTS.iter().map(|n| (*n, "v"))).unwrap();
        let key = InductorPch.compat_key(&f).unwrap();
        assert!(
            key.starts_with("inductor-pch@2;") && key.contains("device=cpu"),
            "{key}"
        );
    }
}
