//! A WASI command written with nothing but `std`: what `wasmproc run` must run unmodified.
//!
//! `wasi-cli [--cat PATH] [--write PATH] [--env NAME] [--spin] [--exit CODE] [WORDS...]`
//! prints its words to stdout and a note to stderr, and each option exercises one grant:
//! files (`--cat`, `--write`), the environment (`--env`), a program that never ends
//! (`--spin`, for timeouts and Ctrl-C), and the exit code (`--exit`).

use std::process::ExitCode;

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
            word => words.push(word.to_owned()),
        }
    }
    println!("{}", words.join(" "));
    eprintln!("wasi-cli: done");
    ExitCode::from(code)
}
