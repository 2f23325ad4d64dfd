//! Dataplane files as the watcher reads them: any bytes, as YAML or JSON,
//! through the limits (nesting, aliases, expansion, inbounds, tags) and the
//! parser. Nothing may panic, an accepted file keeps within the limits, and
//! parsing a file document by document, from nothing or from the parse of an
//! earlier version of it, gives the whole-file parser's answer.
#![no_main]

use hdsd::dataplane::{
    parse_file_with, reparse_file, Documents, FileLimits, Format, UnknownFields,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let format = if selector & 1 == 0 {
        Format::Yaml
    } else {
        Format::Json
    };
    // Small limits so that the fuzzer reaches them with small inputs.
    let limits = FileLimits {
        max_file_size: 64 * 1024,
        max_nesting: 8,
        max_aliases: 4,
        max_inbounds: 4,
        max_tags: 4,
        max_documents: 16,
        max_kept_bytes: 1 << 20,
        // Both modes: the pieces must agree with the whole file in each.
        unknown_fields: if selector & 2 == 0 {
            UnknownFields::Refuse
        } else {
            UnknownFields::Warn
        },
    };
    let whole = parse_file_with(text, format, &limits);
    if let Ok(parsed) = &whole {
        for dp in &parsed.dataplanes {
            assert!(dp.inbounds.len() <= limits.max_inbounds);
            assert!(dp.inbounds.iter().all(|i| i.tags.len() <= limits.max_tags));
            // Every accepted dataplane builds a specifier or says why not.
            let _ = hdsd::specifier::build(dp, &hdsd::specifier::SpecifierSettings::default());
        }
    }
    // An earlier version: the text with its lines from the middle on reversed
    // (documents reordered, some of them cut).
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let (head, tail) = lines.split_at(lines.len() / 2);
    let earlier: String = head.iter().chain(tail.iter().rev()).copied().collect();
    let kept = reparse_file(&earlier, format, &limits, &Documents::default())
        .map(|r| r.documents)
        .unwrap_or_default();
    for previous in [Documents::default(), kept] {
        let pieces = reparse_file(text, format, &limits, &previous);
        match (&whole, &pieces) {
            (Ok(w), Ok(p)) => {
                assert!(w.dataplanes.iter().eq(p.dataplanes.iter().map(|d| &**d)));
                assert_eq!(w.ignored, p.ignored);
                assert_eq!(w.warnings, p.warnings);
            }
            (Err(w), Err(p)) => assert_eq!(w, p),
            _ => panic!("whole file: {whole:?}; by documents: {pieces:?}"),
        }
    }
});
