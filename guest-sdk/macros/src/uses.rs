//! `uses!("kv.*", "http.request", "sleep")`: declares the commands a component yields, for
//! `wasmproc inspect` to list beside the grants they need; `uses!(list: "kv.get")`: the
//! commands its entry method `list` yields, for `wasmproc run --method list` to check.
//!
//! The declaration is a static placed in the core module's custom section
//! `wasmproc:commands`, one record per invocation, in the format `wasmproc-types` defines
//! and `wasmproc inspect` reads (`wasmproc_types::commands`), within the bounds it reads.
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
use wasmproc_types::commands::{self, MAX_COMMANDS, MAX_NAME, SECTION};

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
    match validate(&uses) {
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

fn validate(uses: &Uses) -> syn::Result<()> {
    let names = &uses.names;
    let mut errors: Option<syn::Error> = None;
    let mut push = |error: syn::Error| match &mut errors {
        Some(errors) => errors.combine(error),
        None => errors = Some(error),
    };
    if let Some(entry) = &uses.entry {
        let name = syn::ext::IdentExt::unraw(entry).to_string();
        if !commands::is_entry_name(&name) {
            push(syn::Error::new(
                entry.span(),
                format!("`{name}` is not an entry method's name as `uses!` takes it: ASCII letters, digits and `_`"),
            ));
        }
    }
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
    if !commands::is_command_name(name) {
        return Err(format!(
            "`{name}` is not a command name: write a built-in (`sleep`), a family's command (`kv.get`) \
             or a whole family (`kv.*`), in letters, digits, `_` and `-`"
        ));
    }
    Ok(())
}

fn expand(uses: &Uses) -> TokenStream {
    let entry = uses.entry.as_ref().map(|entry| syn::ext::IdentExt::unraw(entry).to_string());
    let names: Vec<String> = uses.names.iter().map(LitStr::value).collect();
    let bytes = commands::encode(entry.as_deref(), &names.iter().map(String::as_str).collect::<Vec<_>>());
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

#[cfg(test)]
mod tests {
    use super::*;

    fn errors_of(input: TokenStream) -> Vec<String> {
        match parse(input).and_then(|uses| validate(&uses)) {
            Ok(()) => Vec::new(),
            Err(error) => error.into_iter().map(|e| e.to_string()).collect(),
        }
    }

    #[test]
    fn accepts_commands_families_and_nothing() {
        assert!(errors_of(quote! { "kv.*", "http.request", "sleep", "inventory.reserve", }).is_empty());
        assert!(errors_of(TokenStream::new()).is_empty());
        assert!(errors_of(quote! { list: "kv.get", "sleep" }).is_empty());
        assert!(errors_of(quote! { r#type: }).is_empty());
        assert!(errors_of(quote! { é: "sleep" })[0].contains("is not an entry method's name"));
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
