//! Completeness checks on single files, read through the host.

use jitship_policy_sdk::{FileEntry, Host, read_to_end};

/// A GCC precompiled header (`.gch`) is complete when it starts with GCC's identification
/// (`gpch` + language + format version). g++ writes the file in place, starting with the
/// placeholder `gpcWrite`, and rewrites the first 8 bytes with the real identification only after
/// everything else is written (observed with GCC 12: `gpcWrite` through 100 MB of writing, then
/// `gpch+014`); a compile still running or killed half-way leaves the placeholder.
pub fn gch_complete(host: &dyn Host, e: &FileEntry) -> Result<(), String> {
    let h = host
        .read_file(&e.path, 0, 8)
        .map_err(|m| format!("cannot read the precompiled header's identification: {m}"))?;
    match h.get(..4) {
        Some(b"gpch") => Ok(()),
        Some(b"gpcW") => Err("precompiled header still being written by g++ (gpcWrite)".into()),
        _ => Err("not a complete GCC precompiled header (no gpch identification)".into()),
    }
}

/// An ELF shared object is complete when its header is in place and the file reaches the end of
/// its section header table (or, without one, of its program header table). The linker writes
/// the header and tables last, so a file being linked in place, or cut short, fails.
pub fn elf_complete(host: &dyn Host, e: &FileEntry) -> Result<(), String> {
    let h = host
        .read_file(&e.path, 0, 64)
        .map_err(|m| format!("cannot read ELF header: {m}"))?;
    if h.len() < 52 || h[..4] != *b"\x7fELF" {
        return Err("not a complete ELF file (no header yet: being linked, or cut short)".into());
    }
    let le = match h[5] {
        1 => true,
        2 => false,
        _ => return Err("ELF header with unknown byte order".into()),
    };
    let u16_at = |o: usize| -> u64 {
        let b = [h[o], h[o + 1]];
        u64::from(if le {
            u16::from_le_bytes(b)
        } else {
            u16::from_be_bytes(b)
        })
    };
    let u32_at = |o: usize| -> u64 {
        let b = [h[o], h[o + 1], h[o + 2], h[o + 3]];
        u64::from(if le {
            u32::from_le_bytes(b)
        } else {
            u32::from_be_bytes(b)
        })
    };
    let u64_at = |o: usize| -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&h[o..o + 8]);
        if le {
            u64::from_le_bytes(b)
        } else {
            u64::from_be_bytes(b)
        }
    };
    let (phoff, phentsize, phnum, shoff, shentsize, shnum) = match h[4] {
        1 => (
            u32_at(0x1C),
            u16_at(0x2A),
            u16_at(0x2C),
            u32_at(0x20),
            u16_at(0x2E),
            u16_at(0x30),
        ),
        2 if h.len() >= 64 => (
            u64_at(0x20),
            u16_at(0x36),
            u16_at(0x38),
            u64_at(0x28),
            u16_at(0x3A),
            u16_at(0x3C),
        ),
        _ => return Err("ELF header with unknown class".into()),
    };
    let end = |off: u64, size: u64, n: u64| off.checked_add(size.checked_mul(n)?);
    let needed = if shoff != 0 && shnum != 0 {
        end(shoff, shentsize, shnum)
    } else if phoff != 0 && phnum != 0 {
        end(phoff, phentsize, phnum)
    } else {
        return Err("ELF file with neither section nor program headers".into());
    };
    match needed {
        Some(n) if n <= e.size => Ok(()),
        _ => Err(format!(
            "ELF file cut short ({} bytes, its headers need {:?})",
            e.size, needed
        )),
    }
}

/// The whole file parses as JSON (files over `limit` bytes are refused).
pub fn json_value(host: &dyn Host, path: &str, limit: usize) -> Result<serde_json::Value, String> {
    let bytes = read_to_end(host, path, limit)?;
    serde_json::from_slice(&bytes).map_err(|e| format!("not valid JSON ({e})"))
}

/// A Python literal written in one go (`vllm_compile_cache.py`, `sglang_compile_cache.py`) is
/// complete when it is UTF-8, starts with `{`, ends with `}` and every bracket and string is
/// closed. Returns the string literals it holds (artifact names, paths).
pub fn python_literal(host: &dyn Host, path: &str, limit: usize) -> Result<Vec<String>, String> {
    let bytes = read_to_end(host, path, limit)?;
    let text =
        std::str::from_utf8(&bytes).map_err(|_| "not UTF-8 (cut short or corrupt)".to_string())?;
    python_literal_text(text)
}

pub fn python_literal_text(text: &str) -> Result<Vec<String>, String> {
    let t = text.trim();
    if !t.starts_with('{') || !t.ends_with('}') {
        return Err(
            "not a complete dict literal (written last, non-atomically: still being written?)"
                .into(),
        );
    }
    let chars: Vec<char> = t.chars().collect();
    let mut stack = Vec::new();
    let mut strings = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            '{' | '[' | '(' => stack.push(c),
            '}' | ']' | ')' => {
                let open = match c {
                    '}' => '{',
                    ']' => '[',
                    _ => '(',
                };
                if stack.pop() != Some(open) {
                    return Err("unbalanced brackets".into());
                }
                if stack.is_empty() && i + 1 != chars.len() {
                    return Err("text after the closing brace".into());
                }
            }
            '\'' | '"' => {
                let triple = i + 2 < chars.len() && chars[i + 1] == c && chars[i + 2] == c;
                let q = if triple { 3 } else { 1 };
                let mut j = i + q;
                let mut s = String::new();
                loop {
                    if j >= chars.len() {
                        return Err("unterminated string".into());
                    }
                    if chars[j] == '\\' {
                        if let Some(&n) = chars.get(j + 1) {
                            s.push(n);
                        }
                        j += 2;
                        continue;
                    }
                    if !triple && chars[j] == '\n' {
                        return Err("newline inside a string".into());
                    }
                    if chars[j] == c
                        && (!triple
                            || (chars.get(j + 1) == Some(&c) && chars.get(j + 2) == Some(&c)))
                    {
                        break;
                    }
                    s.push(chars[j]);
                    j += 1;
                }
                strings.push(s);
                i = j + q;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    if !stack.is_empty() {
        return Err("unclosed brackets".into());
    }
    Ok(strings)
}

#[cfg(test)]
mod tests {
    use super::*;
    use jitship_policy_sdk::DirHost;

    #[test]
    fn python_literals() {
        let ok = "{(Range(1, 2048), 0, 'inductor'): {'graph_handle': ('artifact_compile_range_1_2048_subgraph_0', '/x/y'), 'cache_key': 'ab}c'}}\n";
        let s = python_literal_text(ok).unwrap();
        assert!(s.contains(&"artifact_compile_range_1_2048_subgraph_0".to_string()));
        for bad in [
            &ok[..40],
            "",
            "{'a': '}",
            "{'a': 1}}",
            "{'a': (1, 2]}",
            "[1]",
            "{'a':\n'b}",
        ] {
            assert!(python_literal_text(bad).is_err(), "{bad:?} passed");
        }
        assert!(python_literal_text("{'''a\n}''': 1}").is_ok());
    }

    #[test]
    fn elf_checks() {
        let d = tempfile::tempdir().unwrap();
        let mut elf = vec![0u8; 200];
        elf[..4].copy_from_slice(b"\x7fELF");
        elf[4] = 2;
        elf[5] = 1;
        elf[0x28..0x30].copy_from_slice(&100u64.to_le_bytes()); // shoff
        elf[0x3A..0x3C].copy_from_slice(&64u16.to_le_bytes()); // shentsize
        elf[0x3C..0x3E].copy_from_slice(&1u16.to_le_bytes()); // shnum -> needs 164 bytes
        std::fs::write(d.path().join("ok.so"), &elf).unwrap();
        std::fs::write(d.path().join("short.so"), &elf[..150]).unwrap();
        std::fs::write(d.path().join("zero.so"), vec![0u8; 200]).unwrap();
        std::fs::write(d.path().join("tiny.so"), b"\x7fEL").unwrap();
        let h = DirHost::new(d.path());
        let e = |p: &str| {
            h.entries()
                .unwrap()
                .into_iter()
                .find(|e| e.path == p)
                .unwrap()
        };
        assert!(elf_complete(&h, &e("ok.so")).is_ok());
        for p in ["short.so", "zero.so", "tiny.so"] {
            assert!(elf_complete(&h, &e(p)).is_err(), "{p}");
        }
    }
}
