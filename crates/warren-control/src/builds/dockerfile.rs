//! A Dockerfile, read by the `parse-dockerfile` crate, as the steps a build
//! runs: what each instruction asks, with its line, and a clear error
//! naming the line for what Warren does not build. Variables are left in:
//! they are substituted when the step runs, with the `ARG`s and `ENV`s in
//! scope then.

use parse_dockerfile::{Command, Flag, Instruction, Source};

/// One `FROM` and the steps after it.
#[derive(Debug, Clone)]
pub(crate) struct Stage {
    /// `AS name`, lowercased as Docker does.
    pub name: Option<String>,
    /// The image (or earlier stage), variables not yet substituted.
    pub from: String,
    pub line: usize,
    pub steps: Vec<Step>,
}

#[derive(Debug, Clone)]
pub(crate) struct Step {
    pub line: usize,
    /// The instruction as written (one line), for progress and history.
    pub text: String,
    pub op: Op,
}

/// A command in exec form (argv) or shell form (run by `SHELL`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Cmd {
    Exec(Vec<String>),
    Shell(String),
}

#[derive(Debug, Clone)]
pub(crate) enum Op {
    Run(Cmd),
    Copy(Copy),
    /// `ENV` and `LABEL` arguments: `key=value` pairs, split when run.
    Env(String),
    Label(String),
    /// `ARG name[=default]`, split when run.
    Arg(String),
    Workdir(String),
    User(String),
    Expose(Vec<String>),
    Cmd(Cmd),
    Entrypoint(Cmd),
    Shell(Vec<String>),
}

#[derive(Debug, Clone)]
pub(crate) struct Copy {
    /// ADD: local tar archives are unpacked.
    pub add: bool,
    pub sources: Vec<String>,
    pub dest: String,
    /// `--from`: a stage name or index, or an image.
    pub from: Option<String>,
    pub chown: Option<String>,
    pub chmod: Option<String>,
}

/// A parsed Dockerfile: its global `ARG`s (before the first `FROM`), its
/// stages in order, and its escape character.
#[derive(Debug, Clone)]
pub(crate) struct Dockerfile {
    pub global_args: Vec<(usize, String)>,
    pub stages: Vec<Stage>,
    pub escape: char,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("Dockerfile line {line}: {message}")]
pub(crate) struct DockerfileError {
    pub line: usize,
    pub message: String,
}

fn err<T>(line: usize, message: impl Into<String>) -> Result<T, DockerfileError> {
    Err(DockerfileError {
        line,
        message: message.into(),
    })
}

impl Dockerfile {
    pub(crate) fn parse(text: &str) -> Result<Dockerfile, DockerfileError> {
        let parsed = parse_dockerfile::parse(text).map_err(|e| DockerfileError {
            // The parser says line 0 for the file as a whole.
            line: e.line().max(1),
            message: e.to_string(),
        })?;
        let line_of = |at: usize| text[..at.min(text.len())].matches('\n').count() + 1;
        let escape = parsed
            .parser_directives
            .escape
            .as_ref()
            .map_or('\\', |d| d.value.value);
        let mut global_args = Vec::new();
        let mut stages: Vec<Stage> = Vec::new();
        for inst in &parsed.instructions {
            let span = instruction_span(inst);
            let line = line_of(span.start);
            let end = text[span.start..]
                .find('\n')
                .map_or(text.len(), |n| span.start + n);
            let text_line = text[span.start..end].trim().trim_end_matches('\\').trim();
            let op = match inst {
                Instruction::From(f) => {
                    if let Some(flag) = f.options.first() {
                        return err(line, unsupported_flag("FROM", flag));
                    }
                    let name = f.as_.as_ref().map(|(_, n)| n.value.to_lowercase());
                    if let Some(n) = &name {
                        if !warren_core::build::is_stage_name(n) {
                            return err(line, format!("{n:?} is not a stage name"));
                        }
                        if stages.iter().any(|s| s.name.as_deref() == Some(n)) {
                            return err(line, format!("stage name {n:?} is used twice"));
                        }
                    }
                    stages.push(Stage {
                        name,
                        from: f.image.value.to_string(),
                        line,
                        steps: Vec::new(),
                    });
                    continue;
                }
                Instruction::Arg(a) if stages.is_empty() => {
                    global_args.push((line, a.arguments.value.to_string()));
                    continue;
                }
                Instruction::Arg(a) => Op::Arg(a.arguments.value.to_string()),
                Instruction::Run(r) => {
                    if let Some(flag) = r.options.first() {
                        return err(line, unsupported_flag("RUN", flag));
                    }
                    if !r.here_docs.is_empty() {
                        return err(line, "here-documents in RUN are not supported yet; put the script in a file and COPY it");
                    }
                    Op::Run(command(&r.arguments))
                }
                Instruction::Copy(c) => Op::Copy(copy(line, false, &c.options, &c.src, &c.dest.value)?),
                Instruction::Add(a) => Op::Copy(copy(line, true, &a.options, &a.src, &a.dest.value)?),
                Instruction::Env(e) => Op::Env(e.arguments.value.to_string()),
                Instruction::Label(l) => Op::Label(l.arguments.value.to_string()),
                Instruction::Maintainer(m) => {
                    Op::Label(format!("maintainer=\"{}\"", m.name.value.replace('"', "\\\"")))
                }
                Instruction::Workdir(w) => Op::Workdir(w.arguments.value.to_string()),
                Instruction::User(u) => Op::User(u.arguments.value.to_string()),
                Instruction::Expose(e) => {
                    Op::Expose(e.arguments.iter().map(|p| p.value.to_string()).collect())
                }
                Instruction::Cmd(c) => Op::Cmd(command(&c.arguments)),
                Instruction::Entrypoint(e) => Op::Entrypoint(command(&e.arguments)),
                Instruction::Shell(s) => {
                    Op::Shell(s.arguments.iter().map(|a| a.value.to_string()).collect())
                }
                Instruction::Healthcheck(_) => return err(line, "HEALTHCHECK is not supported: Warren sandboxes have no health checks; remove it"),
                Instruction::Onbuild(_) => return err(line, "ONBUILD is not supported; remove it"),
                Instruction::Volume(_) => return err(line, "VOLUME is not supported: Warren sandboxes have no anonymous volumes; remove it"),
                Instruction::Stopsignal(_) => return err(line, "STOPSIGNAL is not supported: a sandbox's main process gets SIGTERM then SIGKILL; remove it"),
                _ => return err(line, "this instruction is not supported"),
            };
            let Some(stage) = stages.last_mut() else {
                return err(
                    line,
                    "the first instruction must be FROM (or ARG before FROM)",
                );
            };
            stage.steps.push(Step {
                line,
                text: text_line.to_string(),
                op,
            });
        }
        Ok(Dockerfile {
            global_args,
            stages,
            escape,
        })
    }

    /// The stage a `FROM` or `--from` names: by name or index, if earlier
    /// than `before`.
    pub(crate) fn stage_index(&self, name: &str, before: usize) -> Option<usize> {
        let name = name.to_lowercase();
        self.stages[..before]
            .iter()
            .position(|s| s.name.as_deref() == Some(name.as_str()))
            .or_else(|| name.parse::<usize>().ok().filter(|&i| i < before))
    }
}

fn instruction_span(inst: &Instruction<'_>) -> std::ops::Range<usize> {
    match inst {
        Instruction::Add(i) => i.add.span.clone(),
        Instruction::Arg(i) => i.arg.span.clone(),
        Instruction::Cmd(i) => i.cmd.span.clone(),
        Instruction::Copy(i) => i.copy.span.clone(),
        Instruction::Entrypoint(i) => i.entrypoint.span.clone(),
        Instruction::Env(i) => i.env.span.clone(),
        Instruction::Expose(i) => i.expose.span.clone(),
        Instruction::From(i) => i.from.span.clone(),
        Instruction::Healthcheck(i) => i.healthcheck.span.clone(),
        Instruction::Label(i) => i.label.span.clone(),
        Instruction::Maintainer(i) => i.maintainer.span.clone(),
        Instruction::Onbuild(i) => i.onbuild.span.clone(),
        Instruction::Run(i) => i.run.span.clone(),
        Instruction::Shell(i) => i.shell.span.clone(),
        Instruction::Stopsignal(i) => i.stopsignal.span.clone(),
        Instruction::User(i) => i.user.span.clone(),
        Instruction::Volume(i) => i.volume.span.clone(),
        Instruction::Workdir(i) => i.workdir.span.clone(),
        _ => 0..0,
    }
}

fn command(c: &Command<'_>) -> Cmd {
    match c {
        Command::Exec(argv) => Cmd::Exec(argv.value.iter().map(|a| a.value.to_string()).collect()),
        Command::Shell(s) => Cmd::Shell(s.value.to_string()),
        // The enum is non-exhaustive; a new form would be an exec one.
        _ => Cmd::Exec(Vec::new()),
    }
}

fn unsupported_flag(inst: &str, flag: &Flag<'_>) -> String {
    format!("{inst} --{} is not supported", flag.name.value)
}

fn copy(
    line: usize,
    add: bool,
    options: &[Flag<'_>],
    src: &[Source<'_>],
    dest: &str,
) -> Result<Copy, DockerfileError> {
    let inst = if add { "ADD" } else { "COPY" };
    let mut c = Copy {
        add,
        sources: Vec::new(),
        dest: dest.to_string(),
        from: None,
        chown: None,
        chmod: None,
    };
    for flag in options {
        let value = flag.value.as_ref().map(|v| v.value.to_string());
        let slot = match &*flag.name.value {
            "from" if !add => &mut c.from,
            "chown" => &mut c.chown,
            "chmod" => &mut c.chmod,
            _ => return err(line, unsupported_flag(inst, flag)),
        };
        match value.filter(|v| !v.is_empty()) {
            Some(v) => *slot = Some(v),
            None => return err(line, format!("{inst} --{} needs a value", flag.name.value)),
        }
    }
    for s in src {
        match s {
            Source::Path(p) => c.sources.push(p.value.to_string()),
            _ => {
                return err(
                    line,
                    format!("here-documents in {inst} are not supported yet"),
                )
            }
        }
    }
    if c.sources.is_empty() {
        return err(line, format!("{inst} needs a source and a destination"));
    }
    if let Some(url) = c.sources.iter().find(|s| s.contains("://")) {
        return err(
            line,
            format!("{inst} of a URL ({url}) is not supported: download it in a RUN step with --allow for its host"),
        );
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stages_steps_and_lines() {
        let d = Dockerfile::parse(
            "ARG BASE=debian\nFROM $BASE AS Build\nRUN make \\\n  all\nCOPY --chown=1:1 a b /dst/\n\nFROM build\nCOPY --from=build /out /out\nCMD [\"/out\"]\n",
        )
        .unwrap();
        assert_eq!(d.global_args, vec![(1, "BASE=debian".to_string())]);
        assert_eq!(d.stages.len(), 2);
        assert_eq!(d.stages[0].name.as_deref(), Some("build"));
        assert_eq!(d.stages[0].from, "$BASE");
        let run = &d.stages[0].steps[0];
        assert_eq!((run.line, run.text.as_str()), (3, "RUN make"));
        assert!(
            matches!(&run.op, Op::Run(Cmd::Shell(s)) if s.contains("make") && s.contains("all"))
        );
        let Op::Copy(c) = &d.stages[0].steps[1].op else {
            panic!()
        };
        assert_eq!((c.sources.len(), c.chown.as_deref()), (2, Some("1:1")));
        assert_eq!(d.stages[1].line, 7);
        assert_eq!(d.stage_index("BUILD", 1), Some(0));
        assert_eq!(d.stage_index("0", 1), Some(0));
        assert_eq!(d.stage_index("1", 1), None);
        assert!(matches!(&d.stages[1].steps[1].op, Op::Cmd(Cmd::Exec(a)) if a == &["/out"]));
    }

    #[test]
    fn what_is_not_built_names_its_line() {
        let e = |text: &str| Dockerfile::parse(text).unwrap_err();
        assert_eq!(e("FROM a\nRUN --mount=type=cache,target=/x true\n").line, 2);
        assert!(e("FROM a\nRUN --mount=type=cache,target=/x true\n")
            .message
            .contains("--mount"));
        assert_eq!(e("FROM a\n\nHEALTHCHECK CMD true\n").line, 3);
        assert!(e("FROM a\nADD https://example.com/x /x\n")
            .message
            .contains("URL"));
        assert!(e("FROM a\nCOPY --link a /b\n").message.contains("--link"));
        assert!(e("RUN true\n").message.contains("FROM"));
        assert!(e("# nothing\n").message.contains("FROM"));
        let twice = e("FROM a AS x\nFROM b AS x\n");
        assert_eq!(twice.line, 2, "{twice}");
        let empty = e("# nothing\n");
        assert_eq!(empty.line, 1, "{empty}");
    }
}
