//! `#[entry]`: turns `async fn name(ctx: Ctx, input: T) -> Result<R>` into an entry method.
//!
//! The function stays as written, so it can still be called directly. Beside it the macro
//! adds a module of the same name (modules and functions live in different namespaces)
//! holding `ENTRY`, the hidden descriptor that `wasmproc_guest::export!` lists, and
//! `spawn`, which starts the entry in a child process typed by the signature: the input
//! type in, a `Child` whose `join` gives the result type out. The descriptor decodes the
//! input, calls the function and turns its result into a payload, all through generic
//! helpers of the SDK, so the expansion itself stays small and type errors point at the
//! user's signature rather than at generated code.
//!
//! The input type must serialise for `spawn`, but an entry whose input only deserialises
//! is still an entry: the bound is written higher-ranked (`for<'a> T: Serialize`), which
//! the compiler checks where `spawn` is called rather than where it is defined.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote};
use syn::ext::IdentExt as _;
use syn::spanned::Spanned as _;
use syn::{FnArg, ItemFn, ReturnType, Type};

/// What the SDK must be reachable as from the user's crate.
const SDK: &str = "wasmproc_guest";

pub(crate) fn entry(attr: TokenStream, item: TokenStream) -> TokenStream {
    let function = match parse(attr, item.clone()) {
        Ok(function) => function,
        Err(error) => return error.to_compile_error(),
    };
    match validate(&function) {
        Ok(types) => expand(&function, &types),
        // Keep the function so the mistake is the only error reported, not also every use
        // of a function that vanished.
        Err(error) => {
            let error = error.to_compile_error();
            quote! { #error #item }
        }
    }
}

fn parse(attr: TokenStream, item: TokenStream) -> syn::Result<ItemFn> {
    if !attr.is_empty() {
        return Err(syn::Error::new(attr.span(), "`#[entry]` takes no arguments"));
    }
    syn::parse2(item).map_err(|error| {
        syn::Error::new(error.span(), "`#[entry]` applies to an `async fn name(ctx: Ctx, input: T) -> Result<R>`")
    })
}

/// The entry's input type and the type of its result's value.
struct Types<'a> {
    input: &'a Type,
    output: &'a Type,
}

fn validate(function: &ItemFn) -> syn::Result<Types<'_>> {
    let sig = &function.sig;
    let mut errors = Errors::default();
    if sig.asyncness.is_none() {
        errors.push(sig.fn_token.span, "an entry must be an `async fn`");
    }
    if let Some(constness) = &sig.constness {
        errors.push(constness.span, "an entry cannot be a `const fn`");
    }
    if let Some(unsafety) = &sig.unsafety {
        errors.push(unsafety.span, "an entry cannot be an `unsafe fn`");
    }
    if let Some(abi) = &sig.abi {
        errors.push(abi.span(), "an entry cannot declare an ABI");
    }
    if !sig.generics.params.is_empty() || sig.generics.where_clause.is_some() {
        errors.push(sig.generics.span(), "an entry cannot be generic: its input and result types must be concrete");
    }
    if let Some(variadic) = &sig.variadic {
        errors.push(variadic.span(), "an entry cannot be variadic");
    }

    let arguments: Vec<&FnArg> = sig.inputs.iter().collect();
    let mut input = None;
    if let Some(FnArg::Receiver(receiver)) = arguments.first() {
        errors.push(receiver.span(), "an entry is a free function; it cannot take `self`");
    } else if arguments.len() != 2 {
        let span = if arguments.is_empty() { sig.paren_token.span.join() } else { sig.inputs.span() };
        errors.push(
            span,
            format!("an entry takes two arguments, `ctx: Ctx` and its input, but this one takes {}", arguments.len()),
        );
    } else {
        if let FnArg::Typed(ctx) = arguments[0]
            && !is_named(&ctx.ty, "Ctx")
        {
            errors.push(ctx.ty.span(), "the first argument of an entry must be its `Ctx`");
        }
        match arguments[1] {
            FnArg::Typed(typed) if matches!(*typed.ty, Type::ImplTrait(_)) => {
                errors.push(typed.ty.span(), "the input of an entry must be a concrete type, not `impl Trait`")
            }
            FnArg::Typed(typed) => input = Some(&*typed.ty),
            FnArg::Receiver(receiver) => errors.push(receiver.span(), "an entry's input cannot be `self`"),
        }
    }

    let mut output = None;
    match &sig.output {
        ReturnType::Default => errors.push(sig.ident.span(), "an entry must return `Result<T>`; it returns `()`"),
        ReturnType::Type(_, ty) if !is_named(ty, "Result") => {
            errors.push(ty.span(), "an entry must return `Result<T>` (`T` is serialised as its JSON result)")
        }
        ReturnType::Type(_, ty) => match result_value(ty) {
            Some(value) => output = Some(value),
            None => errors.push(ty.span(), "an entry must return `Result<T>`, naming `T`, the type of its result"),
        },
    }
    errors.finish()?;
    match (input, output) {
        (Some(input), Some(output)) => Ok(Types { input, output }),
        // Every path that leaves one unset recorded an error, returned above.
        _ => Err(syn::Error::new(sig.span(), "an entry takes `ctx: Ctx` and its input, and returns `Result<T>`")),
    }
}

/// The `T` of `Result<T>` or `Result<T, E>` (any path ending in `Result`).
fn result_value(ty: &Type) -> Option<&Type> {
    match ty {
        Type::Paren(inner) => result_value(&inner.elem),
        Type::Group(inner) => result_value(&inner.elem),
        Type::Path(path) => match &path.path.segments.last()?.arguments {
            syn::PathArguments::AngleBracketed(arguments) => {
                arguments.args.iter().find_map(|argument| match argument {
                    syn::GenericArgument::Type(value) => Some(value),
                    _ => None,
                })
            }
            _ => None,
        },
        _ => None,
    }
}

fn expand(function: &ItemFn, types: &Types<'_>) -> TokenStream {
    let sdk = format_ident!("{SDK}");
    let name = &function.sig.ident;
    let method = name.unraw().to_string();
    let vis = &function.vis;
    let (input, output) = (types.input, types.output);
    let module_doc = format!("The `{method}` entry: `spawn` starts it in a child process.");
    let entry_doc = format!("The `{method}` entry's descriptor, for `{SDK}::export!`.");
    let spawn_doc = format!(
        "Starts a child process of this component running the `{method}` entry with `input`; \
         resolves to the child once it runs, whose `join` gives the entry's result. Fails as \
         `Ctx::spawn` does."
    );
    let spawn_link_doc = "Like `spawn`, and links this process to the child before it first runs (see \
                          `Ctx::link`). Fails as `Ctx::spawn_link` does.";
    quote! {
        #function

        #[doc = #module_doc]
        #vis mod #name {
            // The entry's types are written in the scope around it.
            #[allow(unused_imports, reason = "the entry's types may need nothing from the parent's scope")]
            use super::*;

            #[doc = #entry_doc]
            #[doc(hidden)]
            pub const ENTRY: ::#sdk::__private::Entry =
                ::#sdk::__private::Entry::new(#method, |ctx, input| ::#sdk::__private::start(super::#name, ctx, input));

            #[doc = #spawn_doc]
            pub fn spawn(ctx: &::#sdk::Ctx, input: #input) -> ::#sdk::Spawn<#output>
            where
                for<'__wasmproc> #input: ::#sdk::__private::Serialize,
            {
                ::#sdk::__private::spawn_entry(ctx, #method, input)
            }

            #[doc = #spawn_link_doc]
            pub fn spawn_link(ctx: &::#sdk::Ctx, input: #input) -> ::#sdk::Spawn<#output>
            where
                for<'__wasmproc> #input: ::#sdk::__private::Serialize,
            {
                ::#sdk::__private::spawn_link_entry(ctx, #method, input)
            }
        }
    }
}

/// Whether `ty` is a path whose last segment is `name` (so `Ctx`, `wasmproc_guest::Ctx` and
/// `anyhow::Result<T>` all pass): aliases cannot be resolved in a macro, and the trait
/// bounds of the SDK's helpers catch whatever this lets through.
fn is_named(ty: &Type, name: &str) -> bool {
    match ty {
        Type::Path(path) => path.qself.is_none() && path.path.segments.last().is_some_and(|s| s.ident == name),
        Type::Paren(inner) => is_named(&inner.elem, name),
        Type::Group(inner) => is_named(&inner.elem, name),
        _ => false,
    }
}

/// Collects every mistake in a signature, so one compile reports them all.
#[derive(Default)]
struct Errors(Option<syn::Error>);

impl Errors {
    fn push(&mut self, span: Span, message: impl std::fmt::Display) {
        let error = syn::Error::new(span, message);
        match &mut self.0 {
            Some(first) => first.combine(error),
            None => self.0 = Some(error),
        }
    }

    fn finish(self) -> syn::Result<()> {
        self.0.map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errors_of(item: TokenStream) -> Vec<String> {
        let function = parse(TokenStream::new(), item).expect("parses");
        match validate(&function) {
            Ok(_) => vec![],
            Err(error) => error.into_iter().map(|e| e.to_string()).collect(),
        }
    }

    #[test]
    fn accepts_the_documented_shape() {
        assert!(errors_of(quote! { async fn main(ctx: Ctx, n: u32) -> Result<u32> { Ok(n) } }).is_empty());
        assert!(
            errors_of(quote! {
                pub async fn add(_: wasmproc_guest::Ctx, (a, b): (i64, i64)) -> anyhow::Result<i64> { Ok(a + b) }
            })
            .is_empty()
        );
    }

    #[test]
    fn rejects_a_plain_fn() {
        assert_eq!(
            errors_of(quote! { fn main(ctx: Ctx, n: u32) -> Result<u32> { Ok(n) } }),
            ["an entry must be an `async fn`"]
        );
    }

    #[test]
    fn rejects_wrong_arity_and_a_missing_ctx() {
        let one = errors_of(quote! { async fn main(ctx: Ctx) -> Result<()> { Ok(()) } });
        assert_eq!(one, ["an entry takes two arguments, `ctx: Ctx` and its input, but this one takes 1"]);
        let none = errors_of(quote! { async fn main() -> Result<()> { Ok(()) } });
        assert_eq!(none, ["an entry takes two arguments, `ctx: Ctx` and its input, but this one takes 0"]);
        let no_ctx = errors_of(quote! { async fn main(n: u32, m: u32) -> Result<()> { Ok(()) } });
        assert_eq!(no_ctx, ["the first argument of an entry must be its `Ctx`"]);
    }

    #[test]
    fn rejects_a_missing_result_and_reports_every_mistake() {
        let errors = errors_of(quote! { fn main<T>(ctx: Ctx, n: T) { } });
        assert_eq!(
            errors,
            [
                "an entry must be an `async fn`",
                "an entry cannot be generic: its input and result types must be concrete",
                "an entry must return `Result<T>`; it returns `()`",
            ]
        );
        let errors = errors_of(quote! { async fn main(ctx: Ctx, n: u32) -> u32 { n } });
        assert_eq!(errors, ["an entry must return `Result<T>` (`T` is serialised as its JSON result)"]);
    }

    #[test]
    fn rejects_an_untyped_result_and_an_impl_trait_input() {
        let errors = errors_of(quote! { async fn main(ctx: Ctx, n: u32) -> Result { Ok(n) } });
        assert_eq!(errors, ["an entry must return `Result<T>`, naming `T`, the type of its result"]);
        let errors = errors_of(quote! { async fn main(ctx: Ctx, n: impl Into<u32>) -> Result<u32> { Ok(n.into()) } });
        assert_eq!(errors, ["the input of an entry must be a concrete type, not `impl Trait`"]);
    }

    #[test]
    fn expansion_spawns_with_the_entry_types() {
        let function: ItemFn =
            syn::parse2(quote! { pub async fn square(ctx: Ctx, i: u64) -> anyhow::Result<Vec<u64>> { todo!() } })
                .unwrap();
        let types = validate(&function).expect("a valid entry");
        let expanded = expand(&function, &types).to_string();
        let spawn = "pub fn spawn (ctx : & :: wasmproc_guest :: Ctx , input : u64) -> :: wasmproc_guest :: Spawn < Vec < u64 > >";
        assert!(expanded.contains(spawn), "{expanded}");
        assert!(
            expanded.contains("for < '__wasmproc > u64 : :: wasmproc_guest :: __private :: Serialize"),
            "{expanded}"
        );
        assert!(expanded.contains("spawn_entry (ctx , \"square\" , input)"), "{expanded}");
        assert!(expanded.contains("spawn_link_entry (ctx , \"square\" , input)"), "{expanded}");
    }

    #[test]
    fn rejects_arguments_and_non_functions() {
        let error = parse(quote! { name = "x" }, quote! { async fn main(ctx: Ctx, n: u32) -> Result<u32> { Ok(n) } });
        assert_eq!(error.err().map(|e| e.to_string()).as_deref(), Some("`#[entry]` takes no arguments"));
        let error = parse(TokenStream::new(), quote! { struct Main; });
        assert!(error.err().is_some_and(|e| e.to_string().contains("applies to an `async fn")));
    }

    #[test]
    fn expansion_names_the_method_without_raw_prefix() {
        let function: ItemFn =
            syn::parse2(quote! { async fn r#type(ctx: Ctx, n: u32) -> Result<u32> { Ok(n) } }).unwrap();
        let types = validate(&function).expect("a valid entry");
        let expanded = expand(&function, &types).to_string();
        assert!(expanded.contains("\"type\""), "{expanded}");
        assert!(expanded.contains("mod r#type"), "{expanded}");
    }
}
