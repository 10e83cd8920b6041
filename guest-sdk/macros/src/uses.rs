//! `uses!("kv.*", "http.request", "sleep")`: declares the commands a component yields, for
//! `wasmproc inspect` to list beside the grants they need; `uses!(list: "kv.get")`: the
//! commands its entry method `list` yields, for `wasmproc run --method list` to check.
//!
//! The declaration is a static placed in the core module's custom section
//! `wasmproc:commands`. The linker concatenates every object's sections of one name, so
//! the section is a sequence of self-delimiting records, one per invocation (in this crate
//! or any it links), each readable and skippable on its own:
//!
//! 1. the format's version, one byte: [`VERSION`] for the commands of every entry method,
//!    [`ENTRY_VERSION`] for those of one;
//! 2. the length in bytes of the rest of the record, an unsigned LEB128;
//! 3. for [`ENTRY_VERSION`], the entry method's name as a Wasm name: its length in bytes
//!    (unsigned LEB128), then its UTF-8;
//! 4. the number of commands, an unsigned LEB128;
//! 5. each command as a Wasm name.
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

/// The version of the record format of the commands of every entry method.
const VERSION: u8 = 1;

/// The version of the record format of the commands of one entry method.
const ENTRY_VERSION: u8 = 2;

/// The most commands one declaration may name (the host reads at most as many in all).
const MAX_COMMANDS: usize = 256;

/// The longest command name, in bytes (the host reads none longer).
const MAX_NAME: usize = 128;

/// A declaration: the entry method it is of (`None`: every one), and its commands.
struct Uses {
    entry: Option<syn::Ident>,
    names: Vec<LitStr>,
}

pub(crate) fn uses(input: TokenStream) -> TokenStream {
    let uses = match parse(input) {
        Ok(uses) => uses,
        Err(error) => return error.to_compile_error(),
    };
    match validate(&uses.names) {
        Ok(()) => expand(&uses),
        Err(error) => error.to_compile_error(),
    }
}

fn parse(input: TokenStream) -> syn::Result<Uses> {
    let parser = |stream: syn::parse::ParseStream<'_>| -> syn::Result<Uses> {
        let entry = if stream.peek(syn::Ident) && stream.peek2(syn::Token![:]) {
            let entry: syn::Ident = stream.parse()?;
            stream.parse::<syn::Token![:]>()?;
            Some(entry)
        } else {
            None
        };
        let names = Punctuated::<LitStr, syn::Token![,]>::parse_terminated(stream)?;
        Ok(Uses { entry, names: names.into_iter().collect() })
    };
    parser.parse2(input).map_err(|error| {
        syn::Error::new(
            error.span(),
            "`uses!` takes command names as string literals, after the entry method they are of if they are not \
             of every one: `uses!(\"kv.get\", \"sleep\")`, `uses!(list: \"kv.get\")`",
        )
    })
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

fn expand(uses: &Uses) -> TokenStream {
    let entry = uses.entry.as_ref().map(|entry| syn::ext::IdentExt::unraw(entry).to_string());
    let bytes = encode(entry.as_deref(), uses.names.iter().map(LitStr::value));
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

/// One record of the section (see the module docs): of `entry`, or of every entry
/// method.
fn encode(entry: Option<&str>, names: impl ExactSizeIterator<Item = String>) -> Vec<u8> {
    let mut body = Vec::new();
    if let Some(entry) = entry {
        leb128(&mut body, entry.len());
        body.extend_from_slice(entry.as_bytes());
    }
    leb128(&mut body, names.len());
    for name in names {
        leb128(&mut body, name.len());
        body.extend_from_slice(name.as_bytes());
    }
    let mut record = vec![if entry.is_some() { ENTRY_VERSION } else { VERSION }];
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
        match parse(input).and_then(|uses| validate(&uses.names)) {
            Ok(()) => Vec::new(),
            Err(error) => error.into_iter().map(|e| e.to_string()).collect(),
        }
    }

    #[test]
    fn encodes_records_of_wasm_names() {
        let record = encode(None, ["kv.*".to_owned(), "sleep".to_owned()].into_iter());
        assert_eq!(record, b"\x01\x0c\x02\x04kv.*\x05sleep");
        assert_eq!(encode(None, std::iter::empty()), [VERSION, 1, 0]);
        let record = encode(Some("list"), ["kv.get".to_owned()].into_iter());
        assert_eq!(record, b"\x02\x0d\x04list\x01\x06kv.get");
        let long = "a".repeat(MAX_NAME);
        let record = encode(None, std::iter::once(long.clone()));
        // The rest, 1 (count) + 2 (the name's length) + 128 bytes, takes a two-byte length.
        assert_eq!(&record[..6], [VERSION, 0x83, 0x01, 1, 0x80, 0x01]);
        assert_eq!(&record[6..], long.as_bytes());
    }

    #[test]
    fn accepts_commands_families_and_nothing() {
        assert!(errors_of(quote! { "kv.*", "http.request", "sleep", "inventory.reserve", }).is_empty());
        assert!(errors_of(TokenStream::new()).is_empty());
        assert!(errors_of(quote! { list: "kv.get", "sleep" }).is_empty());
        assert!(errors_of(quote! { r#type: }).is_empty());
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
        let errors = errors_of(quote! { "kv.get", list: "sleep" });
        assert!(errors[0].contains("after the entry method they are of"), "{errors:?}");
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
        let of_entry = expand(&parse(quote! { r#type: "sleep" }).unwrap()).to_string();
        assert!(
            of_entry.contains("[u8 ; 14usize]") && of_entry.contains(r"\x02\x0C\x04type\x01\x05sleep"),
            "{of_entry}"
        );
        assert!(expanded.contains("link_section = \"wasmproc:commands\""), "{expanded}");
        assert!(expanded.contains("[u8 ; 9usize]"), "{expanded}");
        assert!(expanded.contains("# [used]"), "{expanded}");
    }
}
