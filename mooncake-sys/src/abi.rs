//! Which `store_c.h` a library implements, established before the library is opened.
//!
//! `libmooncake_store.so` exports no version symbol, and both layouts of
//! `struct mooncake_replicate_config` that upstream has had export the same function names
//! (kvcache-ai/Mooncake #3881 reorders the struct and replaces `int with_soft_pin` with a soft-pin
//! action and a TTL), so neither the symbol set nor a call can tell them apart: a call with the
//! wrong struct is the very thing to avoid. What does tell is the header the library was built
//! with, which every distribution of the C ABI ships beside it: the tokenspeed-mooncake wheel as
//! `mooncake/include/store_c.h` next to `mooncake/libmooncake_store.so`, a CMake install as
//! `include/store_c.h` next to `lib/`. jitship reads that header (bounded), compares the struct's
//! members and checks that every function it resolves is declared, and refuses anything else,
//! naming the library, what its header declares and what jitship supports.

use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};

/// The layouts of `struct mooncake_replicate_config` jitship knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplicateLayout {
    /// `{ size_t replica_num; int with_soft_pin; int with_hard_pin; const char
    /// **preferred_segments; size_t preferred_segments_count; }`: `store_c.h` from its first
    /// release (#1763) until #3881; [`crate::mooncake_replicate_config`]. Supported.
    WithSoftPin,
    /// #3881: `{ size_t replica_num; int with_hard_pin; const char **preferred_segments; size_t
    /// preferred_segments_count; int soft_pin_action; int has_soft_pin_ttl; uint64_t
    /// soft_pin_ttl_ms; }`. Recognised and refused: no release installable from PyPI has it, so
    /// jitship was never tested against it.
    SoftPinAction,
}

impl ReplicateLayout {
    /// The members, each as [`canonical`] writes it.
    fn members(self) -> &'static [&'static str] {
        match self {
            Self::WithSoftPin => &[
                "size_t replica_num",
                "int with_soft_pin",
                "int with_hard_pin",
                "const char * * preferred_segments",
                "size_t preferred_segments_count",
            ],
            Self::SoftPinAction => &[
                "size_t replica_num",
                "int with_hard_pin",
                "const char * * preferred_segments",
                "size_t preferred_segments_count",
                "int soft_pin_action",
                "int has_soft_pin_ttl",
                "uint64_t soft_pin_ttl_ms",
            ],
        }
    }

    fn supported(self) -> bool {
        self == Self::WithSoftPin
    }
}

impl fmt::Display for ReplicateLayout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::WithSoftPin => {
                "the with_soft_pin layout (mooncake_replicate_config with `int with_soft_pin; int with_hard_pin`)"
            }
            Self::SoftPinAction => {
                "the soft-pin-action layout of kvcache-ai/Mooncake #3881 (mooncake_replicate_config with \
                 `int soft_pin_action; int has_soft_pin_ttl; uint64_t soft_pin_ttl_ms`)"
            }
        })
    }
}

/// What jitship supports, for refusals.
pub const SUPPORTED: &str = "jitship supports the with_soft_pin layout of store_c.h (mooncake_replicate_config \
     `{ size_t replica_num; int with_soft_pin; int with_hard_pin; const char **preferred_segments; \
     size_t preferred_segments_count; }`), tested with tokenspeed-mooncake 0.3.13.post20261026 and \
     0.3.13.post20261027 (docs/mooncake.md#versions-tested)";

/// The ABI a library was found to implement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Abi {
    /// The header it was read from.
    pub header: PathBuf,
    pub layout: ReplicateLayout,
}

/// Most bytes of a header read: the real one is about 6 KiB.
const MOST_HEADER_BYTES: u64 = 1 << 20;

/// Where the header of `library` may be, in order.
pub fn header_candidates(library: &Path) -> Vec<PathBuf> {
    // The real file's folder: a symlink's folder may hold no header.
    let library = std::fs::canonicalize(library).unwrap_or_else(|_| library.to_owned());
    let Some(dir) = library.parent().filter(|d| !d.as_os_str().is_empty()) else {
        return Vec::new();
    };
    let mut found = vec![dir.join("include/store_c.h"), dir.join("store_c.h")];
    if let Some(prefix) = dir.parent() {
        found.insert(1, prefix.join("include/store_c.h"));
    }
    found
}

/// Establishes which `store_c.h` layout `library` implements, from the header beside it, and
/// refuses an absent header, an unknown layout and a known one jitship does not support. The
/// error is the whole explanation; the caller adds the library's path. Nothing is loaded.
pub fn identify(library: &Path, functions: &[&str]) -> Result<Abi, String> {
    let candidates = header_candidates(library);
    let Some(header) = candidates.iter().find(|p| p.is_file()) else {
        let looked: Vec<String> = candidates.iter().map(|p| p.display().to_string()).collect();
        return Err(format!(
            "its ABI cannot be established: no store_c.h beside it (looked for {}); the library exports no \
             version, and layouts with the same function names differ, so jitship reads the header the library \
             was built with. Put that store_c.h at {} (the tokenspeed-mooncake wheel ships it as \
             mooncake/include/store_c.h; a CMake install as include/store_c.h), or give store.mooncake.library \
             as a path to a library installed with its header. {SUPPORTED}",
            if looked.is_empty() {
                "none: give the library as a path".to_owned()
            } else {
                looked.join(", ")
            },
            candidates
                .first()
                .map_or_else(|| "include/store_c.h".into(), |p| p.display().to_string())
        ));
    };
    let mut text = String::new();
    std::fs::File::open(header)
        .and_then(|f| f.take(MOST_HEADER_BYTES).read_to_string(&mut text))
        .map_err(|e| format!("its header {} cannot be read: {e}", header.display()))?;
    let layout = layout_of(&text, functions)
        .map_err(|why| format!("its header {} {why}; {SUPPORTED}", header.display()))?;
    if !layout.supported() {
        return Err(format!(
            "its header {} declares {layout}, which no release installable from PyPI has, so jitship was never \
             tested against it and refuses to pass it a struct; use a library built before that change. {SUPPORTED}",
            header.display()
        ));
    }
    Ok(Abi {
        header: header.clone(),
        layout,
    })
}

/// The layout a header's text declares, or why none known.
pub fn layout_of(header: &str, functions: &[&str]) -> Result<ReplicateLayout, String> {
    let text = strip_comments(header);
    let members = replicate_config_members(&text)
        .ok_or("declares no `struct mooncake_replicate_config { ... };`")?;
    let layout = [ReplicateLayout::WithSoftPin, ReplicateLayout::SoftPinAction]
        .into_iter()
        .find(|l| l.members() == members.as_slice())
        .ok_or_else(|| {
            format!(
                "declares an unknown layout of mooncake_replicate_config `{{ {}; }}`",
                members.join("; ")
            )
        })?;
    let missing: Vec<&str> = functions
        .iter()
        .copied()
        .filter(|f| !declares(&text, f))
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "does not declare {} (an unknown store_c.h)",
            missing.join(", ")
        ));
    }
    Ok(layout)
}

/// The text without C comments.
fn strip_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    loop {
        let block = rest.find("/*");
        let line = rest.find("//");
        match (block, line) {
            (Some(b), l) if l.is_none_or(|l| b < l) => {
                out.push_str(&rest[..b]);
                out.push(' ');
                rest = rest[b + 2..]
                    .find("*/")
                    .map_or("", |e| &rest[b + 2 + e + 2..]);
            }
            (_, Some(l)) => {
                out.push_str(&rest[..l]);
                rest = rest[l..].find('\n').map_or("", |e| &rest[l + e..]);
            }
            _ => {
                out.push_str(rest);
                return out;
            }
        }
    }
}

/// The members of the definition of `struct mooncake_replicate_config`, each [`canonical`].
fn replicate_config_members(text: &str) -> Option<Vec<String>> {
    const NAME: &str = "struct mooncake_replicate_config";
    let mut from = 0;
    while let Some(at) = text[from..].find(NAME) {
        let after = &text[from + at + NAME.len()..];
        from += at + NAME.len();
        // A definition, not a use (`typedef struct mooncake_replicate_config x_t;`).
        let Some(body) = after.trim_start().strip_prefix('{') else {
            continue;
        };
        let body = &body[..body.find('}')?];
        if body.contains('{') {
            return None;
        }
        return Some(
            body.split(';')
                .map(canonical)
                .filter(|m| !m.is_empty())
                .collect(),
        );
    }
    None
}

/// A declaration with its tokens separated by single spaces (`*` is a token of its own).
fn canonical(decl: &str) -> String {
    decl.replace('*', " * ")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// Whether `text` declares the function `name` (the name followed by `(`).
fn declares(text: &str, name: &str) -> bool {
    text.match_indices(name).any(|(i, _)| {
        let before = text[..i].chars().next_back();
        let after = text[i + name.len()..].trim_start();
        !before.is_some_and(|c| c.is_alphanumeric() || c == '_') && after.starts_with('(')
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The struct as the header of tokenspeed-mooncake 0.3.13.post20261026/7 declares it.
    const OLD: &str = "typedef void *mooncake_store_t;\n\
        struct mooncake_replicate_config {\n    size_t replica_num;\n    int with_soft_pin;\n    \
        int with_hard_pin;\n    const char **preferred_segments;\n    size_t preferred_segments_count;\n};\n\
        typedef struct mooncake_replicate_config mooncake_replicate_config_t;\n\
        int mooncake_store_put(mooncake_store_t store, const char *key);\n";

    /// The struct as #3881 declares it, comments included.
    const NEW: &str = "enum mooncake_soft_pin_action { MOONCAKE_SOFT_PIN_PRESERVE = 0 };\n\
        struct mooncake_replicate_config {\n    size_t replica_num;\n    int with_hard_pin;\n    \
        const char** preferred_segments;\n    size_t preferred_segments_count;\n    \
        /* One of enum mooncake_soft_pin_action; put functions return -1\n     * for any other value. */\n    \
        int soft_pin_action;\n    // TTL override\n    int has_soft_pin_ttl;\n    uint64_t soft_pin_ttl_ms;\n};\n\
        int mooncake_store_put (mooncake_store_t store);\n";

    #[test]
    fn known_layouts_are_recognised() {
        let f = &["mooncake_store_put"];
        assert_eq!(layout_of(OLD, f), Ok(ReplicateLayout::WithSoftPin));
        assert_eq!(layout_of(NEW, f), Ok(ReplicateLayout::SoftPinAction));
    }

    #[test]
    fn unknown_layouts_and_headers_are_refused() {
        let f = &["mooncake_store_put"];
        let extra = OLD.replace("int with_hard_pin;", "int with_hard_pin; int with_future;");
        let err = layout_of(&extra, f).unwrap_err();
        assert!(
            err.contains("unknown layout") && err.contains("int with_future"),
            "{err}"
        );
        let swapped = OLD.replace("int with_soft_pin;", "long with_soft_pin;");
        assert!(layout_of(&swapped, f).is_err());
        assert!(layout_of("int x;", f).unwrap_err().contains("declares no"));
        // The struct alone is not enough: every function used must be declared.
        let err = layout_of(OLD, &["mooncake_store_put", "mooncake_store_get_into"]).unwrap_err();
        assert!(err.contains("mooncake_store_get_into"), "{err}");
        // A commented-out declaration does not count.
        let commented = OLD.replace("int mooncake_store_put(", "// int mooncake_store_put(");
        assert!(layout_of(&commented, f).is_err());
    }

    #[test]
    fn headers_are_looked_for_beside_the_library() {
        let c = header_candidates(Path::new("/opt/mc/lib/libmooncake_store.so"));
        assert_eq!(
            c,
            [
                PathBuf::from("/opt/mc/lib/include/store_c.h"),
                PathBuf::from("/opt/mc/include/store_c.h"),
                PathBuf::from("/opt/mc/lib/store_c.h"),
            ]
        );
        assert!(header_candidates(Path::new("libmooncake_store.so")).is_empty());
    }
}
