//! The spec parser: JSON into a `SandboxSpec`, `resolve()`, and the text
//! forms it accepts (sizes, durations, CPU amounts, labels, selectors).
//! Nothing may panic, and a spec that resolves must read back from its own
//! serialised form (that is how it is stored) with the same resources.
#![no_main]

use libfuzzer_sys::fuzz_target;
use warren_core::labels::{self, Labels};
use warren_core::quantity;
use warren_core::{SandboxSpec, Selector};

fuzz_target!(|data: &[u8]| {
    if let Ok(spec) = serde_json::from_slice::<SandboxSpec>(data) {
        let resolved = spec.resolve();
        let (ttl, keep, delay) = (spec.ttl(), spec.keep_for(), spec.delay_for());
        let json = serde_json::to_vec(&spec).expect("a parsed spec serialises");
        let again: SandboxSpec = serde_json::from_slice(&json).unwrap_or_else(|e| {
            panic!(
                "stored spec {} does not parse: {e}",
                String::from_utf8_lossy(&json)
            )
        });
        if let Ok(r) = &resolved {
            assert_eq!(
                again.resolve().as_ref(),
                Ok(r),
                "{}",
                String::from_utf8_lossy(&json)
            );
            assert_eq!(
                (again.ttl(), again.keep_for(), again.delay_for()),
                (ttl, keep, delay)
            );
        }
    }
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(n) = quantity::parse_size(text) {
        assert_eq!(quantity::parse_size(&quantity::format_size(n)), Ok(n));
    }
    if let Ok(d) = quantity::parse_duration(text) {
        assert_eq!(
            quantity::parse_duration(&quantity::format_duration(d)),
            Ok(d)
        );
    }
    let _ = quantity::parse_cpu(text);
    if let Ok((k, v)) = labels::parse_pair(text) {
        let mut l = Labels::new();
        l.insert(k, v);
        assert!(labels::validate(&l).is_ok());
    }
    if let Ok(sel) = Selector::parse(text) {
        let mut l = Labels::new();
        l.insert("a".into(), "b".into());
        let _ = sel.matches(&l);
        let _ = sel.matches(&Labels::new());
    }
});
