//! Bounds on what is compiled, checked before compiling: a compile costs time and memory
//! in proportion to what it is given (a core module of 1,000,000 empty functions took 44 s
//! and 5.4 GiB; one function of 7 MB took 706 MiB), so a runtime refuses Wasm past
//! [`Config::max_module_size`], [`Config::max_functions`] or
//! [`Config::max_function_size`], with an error naming the limit, the value found and
//! the flag that raises it.
//!
//! The check reads section headers and the size prefix of each function body with
//! `wasmparser` (the copy wasmtime uses), without validating or decoding any code: the
//! function count is known from a section's header, so even a module of a million
//! functions is refused in about a millisecond. Nested core modules and components of a
//! component are walked too, and their functions counted together, since a component's
//! compile compiles them all. A module wasmparser cannot read is left to wasmtime, whose
//! compile parses the same way and so fails before compiling anything.

use anyhow::ensure;
use wasmparser::{Parser, Payload};

use super::config::Config;

/// Refuses `bytes` (Wasm, a core module or a component) if they are past one of the
/// limits of `config`.
pub(crate) fn check(bytes: &[u8], config: &Config) -> anyhow::Result<()> {
    let what = if bytes.get(4..8) == Some(&[1, 0, 0, 0]) { "module" } else { "component" };
    ensure!(
        bytes.len() <= config.max_module_size,
        "the {what} is {} bytes, more than `max_module_size` of {} (raise it with `--max-module-size`)",
        bytes.len(),
        config.max_module_size
    );
    let max_functions = config.max_functions as u64;
    let mut functions: u64 = 0;
    let mut count = |n: u32| -> anyhow::Result<()> {
        functions += u64::from(n);
        ensure!(
            functions <= max_functions,
            "the {what} has {}{functions} functions, more than `max_functions` of {max_functions} \
             (raise it with `--max-functions`)",
            if functions > u64::from(n) { "at least " } else { "" }
        );
        Ok(())
    };
    // The index of a body in its core module's code section, for the error.
    let mut body = 0;
    for payload in Parser::new(0).parse_all(bytes) {
        let Ok(payload) = payload else { return Ok(()) };
        match payload {
            // A core module's own functions (its imports are compiled by their providers).
            Payload::FunctionSection(reader) => count(reader.count())?,
            // Each canonical lift or lower of a component is compiled into a trampoline.
            Payload::ComponentCanonicalSection(reader) => count(reader.count())?,
            Payload::CodeSectionStart { .. } => body = 0,
            Payload::CodeSectionEntry(function) => {
                let size = function.range().len();
                ensure!(
                    size <= config.max_function_size,
                    "function {body} of the {what}'s code is {size} bytes, more than `max_function_size` \
                     of {} (raise it with `--max-function-size`)",
                    config.max_function_size
                );
                body += 1;
            }
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> Config {
        Config::default().max_module_size(10_000).max_functions(3).max_function_size(100)
    }

    fn refusal(wat: &str) -> String {
        format!("{:#}", check(&wat::parse_str(wat).unwrap(), &config()).unwrap_err())
    }

    #[test]
    fn modules_within_the_limits_pass() {
        let module = wat::parse_str("(module (func) (func) (func (drop (i32.const 1))))").unwrap();
        check(&module, &config()).unwrap();
    }

    #[test]
    fn each_limit_is_named_with_the_value_found() {
        let error = refusal("(module (func) (func) (func) (func))");
        assert!(error.contains("the module has 4 functions, more than `max_functions` of 3"), "{error}");
        let big = format!("(module (func {}))", "(drop (i32.const 1))".repeat(40));
        let error = refusal(&big);
        assert!(error.contains("function 0 of the module's code is"), "{error}");
        assert!(error.contains("more than `max_function_size` of 100"), "{error}");
        let huge = format!("(module (data \"{}\"))", "x".repeat(20_000));
        let error = refusal(&huge);
        assert!(error.contains("more than `max_module_size` of 10000 (raise it with `--max-module-size`)"), "{error}");
    }

    /// The functions of every core module a component nests are counted together.
    #[test]
    fn nested_modules_of_a_component_count_together() {
        let error = refusal("(component (core module (func) (func)) (component (core module (func) (func))))");
        assert!(error.contains("the component has at least 4 functions"), "{error}");
    }

    /// Malformed Wasm is wasmtime's to describe: the check passes it on.
    #[test]
    fn malformed_wasm_is_left_to_the_compiler() {
        check(b"\0asm\x01\0\0\0\x01\xff\xff", &config()).unwrap();
    }
}
