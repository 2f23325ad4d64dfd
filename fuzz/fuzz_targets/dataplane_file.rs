//! Dataplane files as the watcher reads them: any bytes, as YAML or JSON,
//! through the limits (nesting, aliases, expansion, inbounds, tags) and the
//! parser. Nothing may panic, and an accepted file keeps within the limits.
#![no_main]

use hdsd::dataplane::{parse_file_with, FileLimits, Format};
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
    };
    if let Ok(parsed) = parse_file_with(text, format, &limits) {
        for dp in &parsed.dataplanes {
            assert!(dp.inbounds.len() <= limits.max_inbounds);
            assert!(dp.inbounds.iter().all(|i| i.tags.len() <= limits.max_tags));
            // Every accepted dataplane builds a specifier or says why not.
            let _ = hdsd::specifier::build(dp, &hdsd::specifier::SpecifierSettings::default());
        }
    }
});
