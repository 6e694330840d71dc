//! `warren exec -t` / `-it`: the command on a terminal in the sandbox, over
//! the exec WebSocket (one connection both ways: a keystroke is one small
//! frame, not an HTTP request). With `-i` this process's terminal goes raw
//! and everything typed is the command's, ^C included; its window size
//! follows this terminal's (SIGWINCH). The terminal is restored on every
//! way out: the command's exit, an error, a signal, a panic.

use std::io::{IsTerminal, Write};
use std::os::fd::AsFd;

use anyhow::{anyhow, bail, Context, Result};
use futures_util::{SinkExt, StreamExt};
use nix::sys::termios::{self, SetArg, Termios};
use tokio::io::AsyncReadExt;
use tokio::signal::unix::{signal, SignalKind};
use tokio_tungstenite::tungstenite::Message;
use warren_core::{ErrorBody, ExecEvent, ExecRequest, WindowSize};

use warren_cli::client::Client;

/// This process's terminal in raw mode until dropped.
struct RawMode {
    saved: Termios,
}

impl RawMode {
    fn enter() -> Result<RawMode> {
        let stdin = std::io::stdin();
        let saved = termios::tcgetattr(stdin.as_fd()).context("reading the terminal's settings")?;
        let mut raw = saved.clone();
        termios::cfmakeraw(&mut raw);
        termios::tcsetattr(stdin.as_fd(), SetArg::TCSANOW, &raw)
            .context("putting the terminal in raw mode")?;
        Ok(RawMode { saved })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        // After what was written is out, so the remote's last output is
        // shown as it was meant to be.
        let _ = termios::tcsetattr(std::io::stdin().as_fd(), SetArg::TCSADRAIN, &self.saved);
    }
}

/// This terminal's window size (24x80 when it has none).
fn local_size() -> WindowSize {
    match rustix::termios::tcgetwinsize(std::io::stdin()) {
        Ok(w) if w.ws_row > 0 && w.ws_col > 0 => WindowSize {
            rows: w.ws_row,
            cols: w.ws_col,
        },
        _ => WindowSize::DEFAULT,
    }
}

/// Runs `req` on a terminal in sandbox `id`; the command's exit code.
pub(super) async fn exec(
    client: &Client,
    id: &str,
    mut req: ExecRequest,
    interactive: bool,
) -> Result<i32> {
    if !std::io::stdin().is_terminal() {
        bail!(
            "the input device is not a TTY: -t gives the command a terminal and needs one here; \
             to pipe input, leave -t out (warren exec -i ID -- CMD)"
        );
    }
    let size = local_size();
    req.tty = true;
    req.rows = Some(size.rows);
    req.cols = Some(size.cols);
    let mut socket = client.exec_ws(id).await?;
    socket
        .send(Message::text(serde_json::to_string(&req)?))
        .await
        .context("sending the exec request")?;
    // Signals that end this process now end the session instead, so the
    // terminal is restored (and the command, losing its stream, is killed).
    let mut winch = signal(SignalKind::window_change()).context("SIGWINCH")?;
    let mut term = signal(SignalKind::terminate()).context("SIGTERM")?;
    let mut hup = signal(SignalKind::hangup()).context("SIGHUP")?;
    let mut int = signal(SignalKind::interrupt()).context("SIGINT")?;
    let mut quit = signal(SignalKind::quit()).context("SIGQUIT")?;
    let _raw = if interactive {
        Some(RawMode::enter()?)
    } else {
        None
    };
    let mut stdin = tokio::io::stdin();
    let mut stdin_open = interactive;
    let mut buf = vec![0u8; 32 * 1024];
    let mut stdout = std::io::stdout();
    let mut shown = size;
    loop {
        tokio::select! {
            msg = socket.next() => {
                let msg = match msg {
                    Some(Ok(m)) => m,
                    Some(Err(e)) => return Err(anyhow!("the exec WebSocket broke: {e}")),
                    None => bail!("the exec WebSocket closed before the command's exit"),
                };
                match msg {
                    Message::Binary(data) => {
                        stdout.write_all(&data).and_then(|_| stdout.flush()).context("writing output")?;
                    }
                    Message::Text(text) => {
                        if let Some(code) = event(text.as_str())? {
                            return Ok(code);
                        }
                    }
                    Message::Close(frame) => {
                        let why = frame.map(|f| f.reason.to_string()).unwrap_or_default();
                        bail!("warren up closed the exec before the command's exit{}", if why.is_empty() { String::new() } else { format!(": {why}") });
                    }
                    Message::Ping(_) | Message::Pong(_) | Message::Frame(_) => {}
                }
            }
            n = stdin.read(&mut buf), if stdin_open => match n {
                Ok(0) | Err(_) => stdin_open = false,
                Ok(n) => socket
                    .send(Message::binary(buf[..n].to_vec()))
                    .await
                    .context("sending input")?,
            },
            _ = winch.recv() => {
                let now = local_size();
                if now != shown {
                    shown = now;
                    let resize = serde_json::json!({ "resize": now });
                    socket.send(Message::text(resize.to_string())).await.context("sending a resize")?;
                }
            }
            _ = term.recv() => return Ok(128 + libc::SIGTERM),
            _ = hup.recv() => return Ok(128 + libc::SIGHUP),
            _ = int.recv() => return Ok(128 + libc::SIGINT),
            _ = quit.recv() => return Ok(128 + libc::SIGQUIT),
        }
    }
}

/// A text message of the session: `Some(code)` at the exit, an error for
/// an error answer.
fn event(text: &str) -> Result<Option<i32>> {
    if let Ok(ev) = serde_json::from_str::<ExecEvent>(text) {
        return Ok(match ev {
            ExecEvent::Exit {
                code, timed_out, ..
            } => {
                if timed_out {
                    say_partial!("\r\nwarren: command timed out and was killed\r\n");
                }
                Some(code)
            }
            ExecEvent::Stderr { .. } => {
                if let Some(bytes) = ev.output_bytes() {
                    let _ = std::io::stderr().write_all(&bytes);
                }
                None
            }
            ExecEvent::Error { message } => bail!("exec failed: {message}"),
            _ => None,
        });
    }
    match serde_json::from_str::<ErrorBody>(text) {
        Ok(body) => bail!(body.error.message),
        // Something newer than this CLI knows: not ours to stop on.
        Err(_) => Ok(None),
    }
}
