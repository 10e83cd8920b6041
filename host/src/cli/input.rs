//! What `wasmproc` reads: the program file and the input payloads, each refused or read
//! with a bound before it is read whole, so no input can make the host wait forever or
//! hold more memory than the limits allow.

use std::io::Read as _;
use std::path::Path;

use wasmproc::{Format, Payload};

use super::{Exit, Failure};

/// Reads the program file, refusing before reading it whole what cannot be a program: a
/// path that is not a regular file (a FIFO, a device such as `/dev/zero`, a directory),
/// a file larger than `max_size`, or one whose first bytes are neither Wasm's header nor
/// a precompiled file's nor text. Opened without blocking, so a FIFO is refused, not
/// waited on. A path that cannot be read is a usage error (the path is wrong); a file that
/// cannot be a program is a bad module.
///
/// A text-format module or component (a `.wat` file, or one whose first bytes are `(`
/// after any whitespace) is translated to Wasm here: an error in the text names its line
/// and column.
pub(super) fn read_app(path: &Path, max_size: u64) -> Result<Vec<u8>, Failure> {
    use std::os::unix::fs::{FileTypeExt as _, OpenOptionsExt as _};

    let shown = path.display();
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
        .open(path)
        .map_err(|e| {
            let hint = if e.kind() == std::io::ErrorKind::NotFound { ": check the path" } else { "" };
            Failure::new(Exit::Usage, format!("cannot read `{shown}`: {e}{hint}"))
        })?;
    let metadata = file.metadata().map_err(|e| Failure::new(Exit::Usage, format!("cannot read `{shown}`: {e}")))?;
    let file_type = metadata.file_type();
    if !file_type.is_file() {
        let what = match () {
            () if file_type.is_dir() => "a directory",
            () if file_type.is_fifo() => "a FIFO",
            () if file_type.is_char_device() => "a character device",
            () if file_type.is_block_device() => "a block device",
            () if file_type.is_socket() => "a socket",
            () => "not a regular file",
        };
        return Err(Failure::new(
            Exit::Usage,
            format!("`{shown}` is {what}: give the path of a .wasm file (or of a file made by `wasmproc compile`)"),
        ));
    }
    if metadata.len() > max_size {
        return Err(Failure::new(
            Exit::BadModule,
            format!(
                "`{shown}` is {} bytes, larger than --max-module-size ({max_size} bytes): raise it if the file is a \
                 program you trust",
                metadata.len()
            ),
        ));
    }
    let mut header = [0u8; wasmproc::wasm::PROGRAM_START];
    let mut reader = file.take(max_size);
    let got = read_up_to(&mut reader, &mut header)
        .map_err(|e| Failure::new(Exit::Usage, format!("cannot read `{shown}`: {e}")))?;
    let header = &header[..got];
    let text = is_text(path, header);
    if !text {
        wasmproc::wasm::check_start(header)
            .map_err(|e| Failure::new(Exit::BadModule, format!("cannot load `{shown}`: {e:#}")))?;
    }
    let mut bytes = Vec::with_capacity(usize::try_from(metadata.len()).unwrap_or(0));
    bytes.extend_from_slice(header);
    reader.read_to_end(&mut bytes).map_err(|e| Failure::new(Exit::Usage, format!("cannot read `{shown}`: {e}")))?;
    if text {
        return wat::parse_bytes(&bytes).map(|wasm| wasm.into_owned()).map_err(|e| {
            Failure::new(Exit::BadModule, format!("cannot load `{shown}`: the text is not valid: {}", one_line(&e)))
        });
    }
    Ok(bytes)
}

/// Whether the program at `path`, which starts with `header`, is in the text format: by
/// its extension, or by its first byte past whitespace (a Wasm or precompiled file starts
/// with a magic number that is never `(`).
fn is_text(path: &Path, header: &[u8]) -> bool {
    path.extension().is_some_and(|ext| ext.eq_ignore_ascii_case("wat"))
        || header.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'(')
}

/// A text-format error on one line, its place as "line L, column C": the `wat` crate
/// renders it over several lines (the message, `--> file:L:C`, the source line, a
/// caret).
fn one_line(error: &wat::Error) -> String {
    let rendered = error.to_string();
    let mut lines = rendered.lines();
    let message = lines.next().unwrap_or_default();
    let place = lines.next().and_then(|l| l.trim_start().strip_prefix("--> ")).and_then(|at| {
        let mut parts = at.rsplitn(3, ':');
        Some((parts.next()?, parts.next()?))
    });
    match place {
        Some((column, line)) => format!("{message} (line {line}, column {column})"),
        None => message.to_owned(),
    }
}

/// Reads until `buffer` is full or the end of the input: how many bytes it holds.
fn read_up_to(reader: &mut impl std::io::Read, buffer: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buffer.len() {
        match reader.read(&mut buffer[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// The input payloads: each --input, then --input-file, each checked to be JSON and no
/// larger than --max-payload (which the entry process's input is held to, as any
/// payload), before anything is loaded.
pub(super) fn payloads(texts: &[String], file: Option<&Path>, max_payload: usize) -> Result<Vec<Payload>, Failure> {
    let too_large = |what: String, len: Option<usize>| {
        let size = len.map_or_else(String::new, |len| format!(" ({len} bytes)"));
        Failure::new(
            Exit::Usage,
            format!("{what}{size} is larger than --max-payload ({} bytes): raise --max-payload", max_payload),
        )
    };
    let mut payloads = Vec::new();
    for (i, text) in texts.iter().enumerate() {
        if text.len() > max_payload {
            return Err(too_large(format!("--input #{}", i + 1), Some(text.len())));
        }
        payloads.push(json_payload(text).map_err(|e| {
            Failure::new(
                Exit::Usage,
                format!("--input #{} is not valid JSON ({e}): quote strings, e.g. '\"text\"'", i + 1),
            )
        })?);
    }
    if let Some(path) = file {
        let shown = path.display();
        let text = read_input_file(path, max_payload).map_err(|e| match e {
            InputError::TooLarge(len) => too_large(format!("--input-file `{shown}`"), len),
            InputError::Io(e) => Failure::new(Exit::Usage, format!("cannot read --input-file `{shown}`: {e}")),
        })?;
        payloads.push(
            json_payload(&text)
                .map_err(|e| Failure::new(Exit::Usage, format!("--input-file `{shown}` is not valid JSON: {e}")))?,
        );
    }
    Ok(payloads)
}

/// `text`, checked to be JSON, as a JSON payload of the very bytes the user wrote: a
/// guest that cannot decode it then points its line and column into the user's own text.
fn json_payload(text: &str) -> Result<Payload, serde_json::Error> {
    serde_json::from_str::<serde::de::IgnoredAny>(text)?;
    Ok(Payload { format: Format::Json, data: text.as_bytes().to_vec() })
}

enum InputError {
    /// More than the bound: this many bytes if the size is known (a regular file's).
    TooLarge(Option<usize>),
    Io(std::io::Error),
}

/// Reads an input file, or stdin for `-`, reading at most one byte past `max` whatever
/// the file is (`/dev/urandom`, a pipe), so an endless input costs a bounded read.
fn read_input_file(path: &Path, max: usize) -> Result<String, InputError> {
    let bound = u64::try_from(max).unwrap_or(u64::MAX).saturating_add(1);
    let mut bytes = Vec::new();
    if path == Path::new("-") {
        std::io::stdin().lock().take(bound).read_to_end(&mut bytes).map_err(InputError::Io)?;
    } else {
        let file = std::fs::File::open(path).map_err(InputError::Io)?;
        if let Ok(metadata) = file.metadata()
            && metadata.is_file()
            && metadata.len() > max as u64
        {
            return Err(InputError::TooLarge(usize::try_from(metadata.len()).ok()));
        }
        file.take(bound).read_to_end(&mut bytes).map_err(InputError::Io)?;
    }
    if bytes.len() > max {
        return Err(InputError::TooLarge(None));
    }
    String::from_utf8(bytes).map_err(|e| InputError::Io(std::io::Error::new(std::io::ErrorKind::InvalidData, e)))
}
