//! A WASI command written with nothing but `std`: what `wasmproc run` must run unmodified.
//!
//! `wasi-cli [--cat PATH] [--write PATH] [--env NAME] [--spin] [--exit CODE]
//! [--exit-with-code CODE] [WORDS...]` prints its words to stdout and a note to stderr,
//! and each option exercises one grant: files (`--cat`, `--write`), the environment
//! (`--env`), a program that never ends (`--spin`, for timeouts and Ctrl-C), and the exit
//! code: `--exit` returns it from `main`, which `std` turns into WASI 0.2's `exit` (success
//! or failure only: any failure is 1), and `--exit-with-code` passes it to
//! `exit-with-code` (since WASI 0.2.12), which keeps it, as preview 1's `proc_exit` does.

use std::process::ExitCode;

// `wasi:cli/exit` as WASI 0.2.12 has it: `std` imports the interface at its own version
// for `exit`, and the component's imports are merged into the newer one.
wit_bindgen::generate!({
    inline: "
        package wasi:cli@0.2.12;

        interface exit {
            exit: func(status: result);
            exit-with-code: func(status-code: u8);
        }

        world exit-code {
            import exit;
        }
    ",
});

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let mut words = Vec::new();
    let mut code = 0u8;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--cat" => {
                let path = args.next().unwrap_or_default();
                match std::fs::read_to_string(&path) {
                    Ok(text) => print!("{text}"),
                    Err(e) => {
                        eprintln!("cannot read {path}: {e}");
                        return ExitCode::from(2);
                    }
                }
            }
            "--write" => {
                let path = args.next().unwrap_or_default();
                if let Err(e) = std::fs::write(&path, "written by wasi-cli\n") {
                    eprintln!("cannot write {path}: {e}");
                    return ExitCode::from(2);
                }
            }
            "--env" => {
                let name = args.next().unwrap_or_default();
                println!("{name}={}", std::env::var(&name).unwrap_or_else(|_| "<unset>".to_owned()));
            }
            "--spin" => {
                // Says it has started, so a test knows when to interrupt it.
                println!("spinning");
                let _ = std::io::Write::flush(&mut std::io::stdout());
                let mut n = 0u64;
                loop {
                    n = std::hint::black_box(n.wrapping_add(1));
                }
            }
            "--exit" => code = args.next().and_then(|c| c.parse().ok()).unwrap_or(1),
            "--exit-with-code" => {
                let code = args.next().and_then(|c| c.parse().ok()).unwrap_or(1);
                eprintln!("wasi-cli: exit-with-code {code}");
                wasi::cli::exit::exit_with_code(code);
                unreachable!("`exit-with-code` does not return");
            }
            word => words.push(word.to_owned()),
        }
    }
    println!("{}", words.join(" "));
    eprintln!("wasi-cli: done");
    ExitCode::from(code)
}
