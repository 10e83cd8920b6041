//! `uses!("kv.*", "http.request", "sleep")`: declares the commands a component yields, for
//! `wasmproc inspect` to list beside the grants they need.
//!
//! The declaration is a static placed in the core module's custom section
//! `wasmproc:commands`. The linker concatenates every object's sections of one name, so
//! the section is a sequence of self-delimiting records, one per invocation (in this crate
//! or any it links), each readable and skippable on its own:
//!
//! 1. the format's version, one byte ([`VERSION`]);
//! 2. the length in bytes of the rest of the record, an unsigned LEB128;
//! 3. the number of commands, an unsigned LEB128;
//! 4. each command as a Wasm name: its length in bytes (unsigned LEB128), then its UTF-8.
//!
//! A reader skips a record of a version it does not know by its length. The bounds below
//! are the ones `wasmproc inspect` reads within, so what this macro accepts is always read.
//!
//! Why a declaration rather than a record each provider wrapper makes itself: a static
//! with a `#[link_section]` inside a wrapper is emitted with the SDK's object code whether
//! or not the wrapper is called (for generic and `#[inline]` wrappers as well, with or
//! without LTO), and `wasm-ld` keeps every custom section it is given, so such a record
//! would list every command the SDK can yield, not the ones this component does.

use std::collections::HashSet;

use proc_macro2::{Literal, TokenStream};
use quote::quote;
use syn::LitStr;
use syn::parse::Parser as _;
use syn::punctuated::Punctuated;

/// The custom section's name.
const SECTION: &str = "wasmproc:commands";

/// The version of the record format written here.
const VERSION: u8 = 1;

/// The most commands one declaration may name (the host reads at most as many in all).
const MAX_COMMANDS: usize = 256;

/// The longest command name, in bytes (the host reads none longer).
const MAX_NAME: usize = 128;

pub(crate) fn uses(input: TokenStream) -> TokenStream {
    let names = match parse(input) {
        Ok(names) => names,
        Err(error) => return error.to_compile_error(),
    };
    match validate(&names) {
        Ok(()) => expand(&names),
        Err(error) => error.to_compile_error(),
    }
}

fn parse(input: TokenStream) -> syn::Result<Vec<LitStr>> {
    let names = Punctuated::<LitStr, syn::Token![,]>::parse_terminated.parse2(input).map_err(|error| {
        syn::Error::new(error.span(), "`uses!` takes command names as string literals: `uses!(\"kv.get\", \"sleep\")`")
    })?;
    Ok(names.into_iter().collect())
}

fn validate(names: &[LitStr]) -> syn::Result<()> {
    let mut errors: Option<syn::Error> = None;
    let mut push = |error: syn::Error| match &mut errors {
        Some(errors) => errors.combine(error),
        None => errors = Some(error),
    };
    if names.len() > MAX_COMMANDS {
        push(syn::Error::new(
            names[MAX_COMMANDS].span(),
            format!("`uses!` names at most {MAX_COMMANDS} commands; this one names {}", names.len()),
        ));
    }
    let mut seen = HashSet::new();
    for literal in names {
        let name = literal.value();
        if let Err(why) = check_name(&name) {
            push(syn::Error::new(literal.span(), why));
        } else if !seen.insert(name.clone()) {
            push(syn::Error::new(literal.span(), format!("`{name}` is declared twice")));
        }
    }
    errors.map_or(Ok(()), Err)
}

/// Whether `name` is a command name: a built-in (`sleep`), a family's command
/// (`kv.get`), or a whole family (`kv.*`).
fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("a command name cannot be empty".to_owned());
    }
    if name.len() > MAX_NAME {
        return Err(format!("a command name has at most {MAX_NAME} bytes; this one has {}", name.len()));
    }
    let segments: Vec<&str> = name.split('.').collect();
    let last = segments.len() - 1;
    for (i, segment) in segments.iter().enumerate() {
        let word = !segment.is_empty() && segment.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        let family = i == last && i > 0 && *segment == "*";
        if !word && !family {
            return Err(format!(
                "`{name}` is not a command name: write a built-in (`sleep`), a family's command (`kv.get`) \
                 or a whole family (`kv.*`), in letters, digits, `_` and `-`"
            ));
        }
    }
    Ok(())
}

fn expand(names: &[LitStr]) -> TokenStream {
    let bytes = encode(names.iter().map(LitStr::value));
    let len = bytes.len();
    let bytes = Literal::byte_string(&bytes);
    quote! {
        const _: () = {
            #[used]
            #[cfg_attr(target_arch = "wasm32", unsafe(link_section = #SECTION))]
            static COMMANDS: [u8; #len] = *#bytes;
        };
    }
}

/// One record of the section (see the module docs).
fn encode(names: impl ExactSizeIterator<Item = String>) -> Vec<u8> {
    let mut body = Vec::new();
    leb128(&mut body, names.len());
    for name in names {
        leb128(&mut body, name.len());
        body.extend_from_slice(name.as_bytes());
    }
    let mut record = vec![VERSION];
    leb128(&mut record, body.len());
    record.extend_from_slice(&body);
    record
}

fn leb128(out: &mut Vec<u8>, mut value: usize) {
    loop {
        let byte = (value & 0x7f) as u8;
        value >>= 7;
        if value == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errors_of(input: TokenStream) -> Vec<String> {
        match parse(input).and_then(|names| validate(&names)) {
            Ok(()) => Vec::new(),
            Err(error) => error.into_iter().map(|e| e.to_string()).collect(),
        }
    }

    #[test]
    fn encodes_records_of_wasm_names() {
        let record = encode(["kv.*".to_owned(), "sleep".to_owned()].into_iter());
        assert_eq!(record, b"\x01\x0c\x02\x04kv.*\x05sleep");
        assert_eq!(encode(std::iter::empty()), [VERSION, 1, 0]);
        let long = "a".repeat(MAX_NAME);
        let record = encode(std::iter::once(long.clone()));
        // The rest, 1 (count) + 2 (the name's length) + 128 bytes, takes a two-byte length.
        assert_eq!(&record[..6], [VERSION, 0x83, 0x01, 1, 0x80, 0x01]);
        assert_eq!(&record[6..], long.as_bytes());
    }

    #[test]
    fn accepts_commands_families_and_nothing() {
        assert!(errors_of(quote! { "kv.*", "http.request", "sleep", "inventory.reserve", }).is_empty());
        assert!(errors_of(TokenStream::new()).is_empty());
    }

    #[test]
    fn rejects_bad_names_repeats_and_non_literals() {
        let errors = errors_of(quote! { "", "kv.", "*", "a.*.b", "kv get", "kv.get", "kv.get" });
        assert_eq!(errors.len(), 6, "{errors:?}");
        assert_eq!(errors[0], "a command name cannot be empty");
        assert!(errors[1..5].iter().all(|e| e.contains("is not a command name")), "{errors:?}");
        assert_eq!(errors[5], "`kv.get` is declared twice");
        let errors = errors_of(quote! { kv_get });
        assert!(errors[0].contains("takes command names as string literals"), "{errors:?}");
        let long = "a".repeat(MAX_NAME + 1);
        assert!(errors_of(quote! { #long })[0].contains("at most 128 bytes"));
    }

    #[test]
    fn rejects_too_many_commands() {
        let names = (0..=MAX_COMMANDS).map(|i| format!("p.c{i}"));
        let errors = errors_of(quote! { #(#names),* });
        assert_eq!(errors, ["`uses!` names at most 256 commands; this one names 257"]);
    }

    #[test]
    fn expansion_places_the_record_in_the_section() {
        let expanded = expand(&parse(quote! { "sleep" }).unwrap()).to_string();
        assert!(expanded.contains("link_section = \"wasmproc:commands\""), "{expanded}");
        assert!(expanded.contains("[u8 ; 9usize]"), "{expanded}");
        assert!(expanded.contains("# [used]"), "{expanded}");
    }
}
