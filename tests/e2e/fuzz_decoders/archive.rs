//! Archives: the bytes of a valid layout archive mutated, and the fields of its tar headers (type,
//! name, size, mode, link name) with their checksums recomputed; the properties are the parent's.

use super::*;

/// A tar header field a case rewrites (offset and length in the 512-byte header).
#[derive(Debug, Clone)]
enum HeaderEdit {
    Type(u8),
    Name(String),
    Size(String),
    Mode(String),
    Link(String),
}

fn header_edit() -> impl Strategy<Value = HeaderEdit> {
    prop_oneof![
        prop_oneof![
            Just(b'0'),
            Just(b'1'),
            Just(b'2'),
            Just(b'3'),
            Just(b'4'),
            Just(b'5'),
            Just(b'6'),
            Just(b'7'),
            Just(b'L'),
            Just(b'K'),
            Just(b'x'),
            Just(b'g'),
            Just(b'S'),
            Just(0u8),
            any::<u8>(),
        ]
        .prop_map(HeaderEdit::Type),
        prop_oneof![
            Just("index.json".to_owned()),
            Just("./index.json".to_owned()),
            Just("oci-layout".to_owned()),
            Just("../index.json".to_owned()),
            Just("/etc/cron.d/x".to_owned()),
            Just("blobs/sha256/../../../x".to_owned()),
            Just("blobs//sha256".to_owned()),
            Just(format!("blobs/sha256/{}", "a".repeat(64))),
            Just(format!("./blobs/sha256/{}/", "b".repeat(64))),
            Just("blobs/sha256/.".to_owned()),
            "[ -~]{0,99}",
        ]
        .prop_map(HeaderEdit::Name),
        prop_oneof![
            Just("77777777777".to_owned()),
            Just("00000000000".to_owned()),
            Just("99999999999".to_owned()),
            Just("-1".to_owned()),
            Just(String::new()),
            "[0-7]{1,11}",
        ]
        .prop_map(HeaderEdit::Size),
        prop_oneof![Just("0007777".to_owned()), "[0-7]{7}", "[ -~]{0,7}"]
            .prop_map(HeaderEdit::Mode),
        prop_oneof![
            Just("/etc/passwd".to_owned()),
            Just("../../x".to_owned()),
            Just("index.json".to_owned()),
            "[ -~]{0,99}",
        ]
        .prop_map(HeaderEdit::Link),
    ]
}

/// Where the headers of a tar archive are (valid archives only: each header, then its data
/// rounded up to 512 bytes, until the zero blocks).
fn header_offsets(tar: &[u8]) -> Vec<usize> {
    let mut out = Vec::new();
    let mut at = 0;
    while at + 512 <= tar.len() && tar[at] != 0 {
        out.push(at);
        let size_field = std::str::from_utf8(&tar[at + 124..at + 135]).expect("octal size");
        let size = usize::from_str_radix(size_field.trim_matches(['\0', ' ']), 8).expect("a size");
        at += 512 + size.div_ceil(512) * 512;
    }
    out
}

/// Rewrites one header field and recomputes the header's checksum, so the edit gets past it.
fn edit_header(tar: &mut [u8], at: usize, edit: &HeaderEdit) {
    let header = &mut tar[at..at + 512];
    let mut put = |offset: usize, len: usize, text: &[u8]| {
        let field = &mut header[offset..offset + len];
        field.fill(0);
        let n = text.len().min(len);
        field[..n].copy_from_slice(&text[..n]);
    };
    match edit {
        HeaderEdit::Type(t) => put(156, 1, &[*t]),
        HeaderEdit::Name(n) => {
            put(0, 100, n.as_bytes());
            // The ustar prefix, else it is joined in front of the name.
            put(345, 155, b"");
        }
        HeaderEdit::Size(s) => put(124, 12, s.as_bytes()),
        HeaderEdit::Mode(m) => put(100, 8, m.as_bytes()),
        HeaderEdit::Link(l) => put(157, 100, l.as_bytes()),
    }
    header[148..156].fill(b' ');
    let sum: u32 = header.iter().map(|&b| u32::from(b)).sum();
    header[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
}

#[derive(Debug, Clone)]
enum ArchiveBreak {
    Random(Vec<u8>),
    Mutated(Vec<Mutation>),
    Headers(Vec<(usize, HeaderEdit)>),
}

/// A valid archive, made by `export_archive` from a store the valid layout was imported into.
fn valid_archive(setup: &Setup) -> Vec<u8> {
    let dir = tempfile::tempdir().expect("a temp dir");
    write_layout(
        &dir.path().join("layout"),
        &layout_files(&setup.signed, None),
    );
    let store = LocalStore::scratch(dir.path().join("store")).expect("a store");
    let layout = KeyLayout::new(NAMESPACE).expect("a namespace");
    let policy = setup.policy(TrustMode::Required);
    oci::import(&store, &layout, &policy, &dir.path().join("layout")).expect("import");
    let file = dir.path().join("valid.tar");
    oci::layout::export_archive(&store, &layout, &policy, &[], &file).expect("export");
    std::fs::read(&file).expect("read the archive")
}

/// A layout archive broken (its bytes, or its tar headers with valid checksums):
/// `import_archive` returns within the deadline, never panics, and what it reports as imported
/// is whole and admitted in the store.
#[test]
fn import_archive_survives_broken_archives() {
    let setup = Setup::new();
    let valid = valid_archive(&setup);
    let headers = header_offsets(&valid);
    assert!(headers.len() >= 6, "{} tar headers", headers.len());
    let strategy = prop_oneof![
        1 => proptest::collection::vec(any::<u8>(), 0..2048).prop_map(ArchiveBreak::Random),
        3 => mutations().prop_map(ArchiveBreak::Mutated),
        4 => proptest::collection::vec((any::<usize>(), header_edit()), 1..3)
            .prop_map(ArchiveBreak::Headers),
    ];
    run(strategy, |brk| {
        let bytes = match &brk {
            ArchiveBreak::Random(b) => b.clone(),
            ArchiveBreak::Mutated(ms) => apply(valid.clone(), ms),
            ArchiveBreak::Headers(edits) => {
                let mut tar = valid.clone();
                for (i, edit) in edits {
                    edit_header(&mut tar, headers[i % headers.len()], edit);
                }
                tar
            }
        };
        let dir = tempfile::tempdir().expect("a temp dir");
        let file = dir.path().join("layout.tar");
        std::fs::write(&file, bytes).expect("write the archive");
        let store = Arc::new(LocalStore::scratch(dir.path().join("store")).expect("a store"));
        let policy = setup.policy(TrustMode::Required);
        let (s, p) = (store.clone(), policy.clone());
        let result = within_deadline("import_archive", move || {
            let layout = KeyLayout::new(NAMESPACE).expect("a namespace");
            oci::layout::import_archive(&s, &layout, &p, &file)
        })?;
        if let Ok(report) = result {
            check_imported(&store, &policy, &report)?;
        }
        // Nothing is unpacked beside the archive (the scratch directory is elsewhere, and gone).
        let beside: Vec<_> = std::fs::read_dir(dir.path())
            .expect("the case's directory")
            .map(|e| e.expect("an entry").file_name())
            .collect();
        prop_assert!(
            beside.iter().all(|n| n == "layout.tar" || n == "store"),
            "{beside:?}"
        );
        Ok(())
    });
}
