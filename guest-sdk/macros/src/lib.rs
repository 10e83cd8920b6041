//! Procedural macros of the wasmproc guest SDK; use them through `wasmproc_guest`.
//!
//! Each macro lives in a module of its own, in three stages: parse the input, validate it
//! (every mistake becomes a `syn::Error` spanned at the offending tokens, never a panic),
//! then expand it.

#![deny(missing_docs)]

mod entry;
mod uses;

use proc_macro::TokenStream;

/// Marks an `async fn` as an entry method of the component; see `wasmproc_guest::entry`.
#[proc_macro_attribute]
pub fn entry(attr: TokenStream, item: TokenStream) -> TokenStream {
    entry::entry(attr.into(), item.into()).into()
}

/// Declares the commands the component yields; see `wasmproc_guest::uses`.
#[proc_macro]
pub fn uses(input: TokenStream) -> TokenStream {
    uses::uses(input.into()).into()
}
