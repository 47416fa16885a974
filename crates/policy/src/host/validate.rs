//! What a policy answers, checked before the host believes it: its info, setting specs, keys,
//! selections and retention drops, and its errors bounded in size.

use super::*;
use jitship_policy_contract::truncate;

/// A policy's error, its text bounded (it ends up in logs and reports).
pub(super) fn from_wit(e: wit::PolicyError) -> PolicyError {
    match e {
        wit::PolicyError::MissingFact(f) => {
            PolicyError::MissingFact(truncate(f, MAX_INFO_TEXT_BYTES))
        }
        wit::PolicyError::InvalidInput(m) => {
            PolicyError::InvalidInput(truncate(m, MAX_INFO_TEXT_BYTES))
        }
        wit::PolicyError::Internal(m) => PolicyError::Internal(truncate(m, MAX_INFO_TEXT_BYTES)),
    }
}

pub(super) fn bad(msg: String) -> PolicyError {
    PolicyError::BadOutput(msg)
}

pub(super) fn validate_info(i: wit::PolicyInfo) -> Result<PolicyInfo, PolicyError> {
    let short = |what: &str, v: &str| -> Result<(), PolicyError> {
        if v.is_empty() || v.len() > MAX_NAME_BYTES || v.chars().any(char::is_control) {
            return Err(bad(format!(
                "info().{what} must be 1-{MAX_NAME_BYTES} printable bytes, got {:?}",
                truncate(v.into(), 80)
            )));
        }
        Ok(())
    };
    short("name", &i.name)?;
    short("version", &i.version)?;
    short("cache-kind", &i.cache_kind)?;
    if i.default_root.len() > MAX_INFO_TEXT_BYTES || i.description.len() > MAX_INFO_TEXT_BYTES {
        return Err(bad(format!(
            "info() default-root and description must be at most {MAX_INFO_TEXT_BYTES} bytes"
        )));
    }
    let setting_specs = validate_setting_specs(i.settings)?;
    if i.root_env.len() > MAX_ROOT_ENV
        || i.root_env
            .iter()
            .any(|v| v.is_empty() || v.len() > MAX_NAME_BYTES)
    {
        return Err(bad(format!(
            "info().root-env must hold at most {MAX_ROOT_ENV} names of 1-{MAX_NAME_BYTES} bytes"
        )));
    }
    Ok(PolicyInfo {
        name: i.name,
        version: i.version,
        cache_kind: i.cache_kind,
        default_root: i.default_root,
        root_env: i.root_env,
        description: i.description,
        settings: setting_specs,
    })
}

/// The declared settings: at most `MAX_SETTINGS`, plain distinct names, bounded descriptions and
/// defaults their own kind reads back unchanged (the canonical text).
pub(super) fn validate_setting_specs(
    specs: Vec<wit::SettingSpec>,
) -> Result<Vec<SettingSpec>, PolicyError> {
    if specs.len() > setting::MAX_SETTINGS {
        return Err(bad(format!(
            "info().settings declares {} settings; at most {} are allowed",
            specs.len(),
            setting::MAX_SETTINGS
        )));
    }
    let mut out: Vec<SettingSpec> = Vec::with_capacity(specs.len());
    for s in specs {
        let name = truncate(s.name, 80);
        if !setting::valid_name(&name) || out.iter().any(|o| o.name == name) {
            return Err(bad(format!(
                "info().settings names {name:?}, which is not a distinct name of 1-{} bytes of a-z,                  0-9, '_' and '-' starting with a letter",
                setting::MAX_SETTING_NAME_BYTES
            )));
        }
        let kind = match s.kind {
            wit::SettingKind::Boolean => SettingKind::Boolean,
            wit::SettingKind::Integer => SettingKind::Integer,
            wit::SettingKind::Duration => SettingKind::Duration,
            wit::SettingKind::Bytes => SettingKind::Bytes,
            wit::SettingKind::Text => SettingKind::Text,
        };
        if kind.canonical(&s.default_value).as_deref() != Ok(s.default_value.as_str()) {
            return Err(bad(format!(
                "info().settings gives {name} ({}) the default {:?}, which is not the canonical text of its kind",
                kind.as_str(),
                truncate(s.default_value, 80)
            )));
        }
        if s.description.len() > MAX_INFO_TEXT_BYTES {
            return Err(bad(format!(
                "info().settings describes {name} in {} bytes; at most {MAX_INFO_TEXT_BYTES} are allowed",
                s.description.len()
            )));
        }
        out.push(SettingSpec {
            name,
            kind,
            default_value: s.default_value,
            description: s.description,
        });
    }
    Ok(out)
}

pub(super) fn validate_key(key: String) -> Result<String, PolicyError> {
    if key.is_empty() {
        return Err(bad(
            "compat-key answered an empty key; refuse with missing-fact instead".into(),
        ));
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(bad(format!(
            "compat-key answered a key of {} bytes; at most {MAX_KEY_BYTES} are allowed",
            key.len()
        )));
    }
    if key.chars().any(char::is_control) {
        return Err(bad(format!(
            "compat-key answered a key with control characters: {:?}",
            truncate(key, 80)
        )));
    }
    Ok(key)
}

/// The contract's category, as the host's.
pub(super) fn category(c: wit::ReasonCategory) -> ReasonCategory {
    match c {
        wit::ReasonCategory::Complete => ReasonCategory::Complete,
        wit::ReasonCategory::Temporary => ReasonCategory::Temporary,
        wit::ReasonCategory::Lock => ReasonCategory::Lock,
        wit::ReasonCategory::PerHost => ReasonCategory::PerHost,
        wit::ReasonCategory::Incomplete => ReasonCategory::Incomplete,
        wit::ReasonCategory::ForeignRoot => ReasonCategory::ForeignRoot,
        wit::ReasonCategory::Unparseable => ReasonCategory::Unparseable,
        wit::ReasonCategory::NotCache => ReasonCategory::NotCache,
        wit::ReasonCategory::Excluded => ReasonCategory::Excluded,
    }
}

/// Checks a selection: one decision per entry; `complete` exactly for publish; traits only on
/// published files and only the defined ones; bounded details; a reason for an incomplete cache.
pub(super) fn validate_selection(
    sel: wit::Selection,
    expected: usize,
) -> Result<Selection, PolicyError> {
    if sel.decisions.len() != expected {
        return Err(bad(format!(
            "select answered {} decisions for {expected} entries; it must answer one per entry, in order",
            sel.decisions.len()
        )));
    }
    if sel.incomplete_detail.len() > MAX_DETAIL_BYTES {
        return Err(bad(format!(
            "select's incomplete-detail is {} bytes; at most {MAX_DETAIL_BYTES} are allowed",
            sel.incomplete_detail.len()
        )));
    }
    if !sel.complete && sel.incomplete_detail.trim().is_empty() {
        return Err(bad(
            "select answered an incomplete cache without saying why (incomplete-detail is empty)"
                .into(),
        ));
    }
    let defined = wit::FileTraits::MARKER | wit::FileTraits::EMBEDS_ROOT;
    let decisions = sel
        .decisions
        .into_iter()
        .enumerate()
        .map(|(i, d)| {
            if d.detail.len() > MAX_DETAIL_BYTES {
                return Err(bad(format!(
                    "select's detail for entry {i} is {} bytes; at most {MAX_DETAIL_BYTES} are allowed",
                    d.detail.len()
                )));
            }
            if !defined.contains(d.traits) {
                return Err(bad(format!(
                    "select's traits for entry {i} hold flags the contract does not define"
                )));
            }
            let category = category(d.category);
            let verdict = match d.verdict {
                wit::Verdict::Publish => Verdict::Publish,
                wit::Verdict::Skip => Verdict::Skip,
            };
            match (verdict, category) {
                (Verdict::Publish, ReasonCategory::Complete) => {}
                (Verdict::Publish, c) => {
                    return Err(bad(format!(
                        "select publishes entry {i} with category {c}; a published file's category is complete"
                    )));
                }
                (Verdict::Skip, ReasonCategory::Complete) => {
                    return Err(bad(format!(
                        "select skips entry {i} with category complete; say why it is skipped (temporary, \
                         lock, per-host, incomplete, foreign-root, unparseable, not-cache, excluded)"
                    )));
                }
                (Verdict::Skip, _) if d.traits != wit::FileTraits::empty() => {
                    return Err(bad(format!(
                        "select skips entry {i} but gives it traits; traits belong to published files"
                    )));
                }
                (Verdict::Skip, _) => {}
            }
            Ok(Decision {
                verdict,
                category,
                detail: d.detail,
                marker: d.traits.contains(wit::FileTraits::MARKER),
                embeds_root: d.traits.contains(wit::FileTraits::EMBEDS_ROOT),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Selection {
        decisions,
        complete: sel.complete,
        incomplete_detail: if sel.complete {
            String::new()
        } else {
            sel.incomplete_detail
        },
    })
}

/// The root as the policy sees it: absolute and UTF-8 (the contract passes strings).
pub(super) fn absolute_root(root: &Path) -> Result<String, PolicyError> {
    let abs = std::path::absolute(root).map_err(|e| {
        PolicyError::HostRefusedInput(format!("cannot make {} absolute: {e}", root.display()))
    })?;
    abs.to_str().map(str::to_owned).ok_or_else(|| {
        PolicyError::HostRefusedInput(format!(
            "cache root {} is not valid UTF-8; policies receive roots as text, so move the cache to a UTF-8 path",
            abs.display()
        ))
    })
}

pub(super) fn validate_drops(
    drops: Vec<wit::RetentionDrop>,
    generations: &[GenerationSummary],
    policy: &str,
) -> Result<Vec<RetentionDrop>, PolicyError> {
    let mut out: Vec<RetentionDrop> = Vec::with_capacity(drops.len());
    for d in drops {
        let Some(g) = generations.iter().find(|g| g.id.to_string() == d.id) else {
            return Err(bad(format!(
                "retain answered the id {:?}, which is not one of the generations it was given",
                truncate(d.id, 80)
            )));
        };
        if d.detail.len() > MAX_DETAIL_BYTES {
            return Err(bad(format!(
                "retain's detail for {} is {} bytes; at most {MAX_DETAIL_BYTES} are allowed",
                g.id,
                d.detail.len()
            )));
        }
        if g.pinned {
            tracing::warn!(policy, generation = %g.id, "policy asked to drop a pinned generation; kept");
            continue;
        }
        if !out.iter().any(|o| o.id == g.id) {
            out.push(RetentionDrop {
                id: g.id,
                category: match d.category {
                    wit::RetentionCategory::Count => RetentionCategory::Count,
                    wit::RetentionCategory::Size => RetentionCategory::Size,
                    wit::RetentionCategory::Age => RetentionCategory::Age,
                    wit::RetentionCategory::Superseded => RetentionCategory::Superseded,
                    wit::RetentionCategory::Rule => RetentionCategory::Rule,
                },
                detail: d.detail,
            });
        }
    }
    Ok(out)
}

pub(super) fn check_is_component(bytes: &[u8], source: &str) -> Result<(), PolicyError> {
    if bytes.len() < 8 || &bytes[..4] != b"\0asm" {
        if Engine::detect_precompiled(bytes).is_some() {
            return Err(PolicyError::Load(format!(
                "{source} is a precompiled .cwasm; jitship only loads .wasm components (it compiles and caches them itself)"
            )));
        }
        return Err(PolicyError::Load(format!(
            "{source} is not a WebAssembly file"
        )));
    }
    if bytes[4..8] == [1, 0, 0, 0] {
        return Err(PolicyError::Contract(format!(
            "{source} is a core wasm module, not a component; build it with `jitship policy build` (which \
             componentizes it)"
        )));
    }
    Ok(())
}
