//! The configuration loader (figment: defaults <- TOML or YAML text) and the
//! validation `hdsd validate` and `hdsd serve` run on its result.
#![no_main]

use hdsd::config::Config;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let ext = if selector & 1 == 0 { "toml" } else { "yaml" };
    if let Ok(config) = Config::from_text(text, ext) {
        let _ = config.validate();
    }
});
