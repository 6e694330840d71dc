//! How each language is run: the commands of SandboxFusion's runners
//! (`sandbox/runners/major.py`, `minor.py`), run without a shell, in the
//! request's own directory inside the sandbox.

/// Every value SandboxFusion's `Language` accepts (`runners/types.py`);
/// anything else is a 422 there, and here.
pub const SANDBOX_FUSION_LANGUAGES: &[&str] = &[
    "python",
    "cpp",
    "nodejs",
    "go",
    "go_test",
    "java",
    "php",
    "csharp",
    "bash",
    "typescript",
    "sql",
    "rust",
    "cuda",
    "lua",
    "R",
    "perl",
    "D_ut",
    "ruby",
    "scala",
    "julia",
    "pytest",
    "junit",
    "kotlin_script",
    "jest",
    "verilog",
    "python_gpu",
    "lean",
    "swift",
    "racket",
];

/// Where the code is written: a file with this suffix (SandboxFusion uses a
/// random temporary name) or a fixed name (Java's public class `Main`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Suffix(&'static str),
    Fixed(&'static str),
}

/// A language Warren runs. In commands, `{file}` is the code's absolute
/// path, `{dir}` the request's directory and `{cp}` Java's class path.
#[derive(Debug, Clone, Copy)]
pub struct Language {
    pub name: &'static str,
    pub source: Source,
    pub compile: Option<&'static [&'static str]>,
    pub run: &'static [&'static str],
    /// Compilers and JVMs: sized bigger by default (see `sizes`).
    pub heavy: bool,
    /// Extra environment (Go needs a cache directory; the sandbox may have
    /// no HOME).
    pub env: &'static [(&'static str, &'static str)],
}

const fn lang(name: &'static str, suffix: &'static str, run: &'static [&'static str]) -> Language {
    Language {
        name,
        source: Source::Suffix(suffix),
        compile: None,
        run,
        heavy: false,
        env: &[],
    }
}

const fn compiled(
    name: &'static str,
    suffix: &'static str,
    compile: &'static [&'static str],
    run: &'static [&'static str],
) -> Language {
    Language {
        name,
        source: Source::Suffix(suffix),
        compile: Some(compile),
        run,
        heavy: true,
        env: &[],
    }
}

/// Python, which `/run_jupyter`'s driver is written in.
pub const PYTHON: Language = lang("python", ".py", &["python3", "{file}"]);

/// SandboxFusion runs `python`, from its own conda environment; images
/// (Debian, python:*-slim) reliably have `python3`.
const LANGUAGES: &[Language] = &[
    PYTHON,
    lang("pytest", ".py", &["pytest", "{file}"]),
    compiled(
        "cpp",
        ".cpp",
        &["g++", "-std=c++17", "{file}", "-o", "test"],
        &["{dir}/test"],
    ),
    lang("nodejs", ".js", &["node", "{file}"]),
    lang("typescript", ".ts", &["tsx", "{file}"]),
    Language {
        env: &[
            ("GOCACHE", "/tmp/.warren-fusion-go/cache"),
            ("GOPATH", "/tmp/.warren-fusion-go/path"),
        ],
        ..compiled(
            "go",
            ".go",
            &["go", "build", "-o", "out", "{file}"],
            &["{dir}/out"],
        )
    },
    Language {
        source: Source::Fixed("Main.java"),
        ..compiled(
            "java",
            "",
            &["javac", "-cp", "{cp}", "Main.java"],
            &["java", "-cp", "{cp}", "-ea", "Main"],
        )
    },
    compiled(
        "rust",
        ".rs",
        &["rustc", "{file}", "-o", "test"],
        &["{dir}/test"],
    ),
    lang("php", ".php", &["php", "-f", "{file}"]),
    lang("bash", ".sh", &["bash", "{file}"]),
    lang("lua", ".lua", &["lua", "{file}"]),
    lang("R", ".R", &["Rscript", "{file}"]),
    lang("perl", ".pl", &["perl", "{file}"]),
    lang("ruby", ".rb", &["ruby", "{file}"]),
    Language {
        heavy: true,
        ..lang("julia", ".jl", &["julia", "{file}"])
    },
    Language {
        heavy: true,
        ..lang("kotlin_script", ".kts", &["kotlin", "{file}"])
    },
    compiled(
        "swift",
        ".swift",
        &["swiftc", "{file}", "-o", "test.out"],
        &["{dir}/test.out"],
    ),
    lang("racket", ".rkt", &["racket", "{file}"]),
    compiled(
        "D_ut",
        ".d",
        &["dmd", "{file}", "-unittest", "-of=test"],
        &["{dir}/test"],
    ),
];

/// What a request's language resolves to.
#[derive(Debug, Clone, Copy)]
pub enum Lookup {
    Runs(&'static Language),
    /// A SandboxFusion language that needs SandboxFusion's own bundled
    /// runtime (jars, node_modules, a Go module, a GPU, a Lean project).
    NotRun,
    /// Not a SandboxFusion language at all.
    Unknown,
}

pub fn lookup(name: &str) -> Lookup {
    if let Some(l) = LANGUAGES.iter().find(|l| l.name == name) {
        Lookup::Runs(l)
    } else if SANDBOX_FUSION_LANGUAGES.contains(&name) {
        Lookup::NotRun
    } else {
        Lookup::Unknown
    }
}

/// The languages Warren runs, for messages and docs.
pub fn supported() -> Vec<&'static str> {
    LANGUAGES.iter().map(|l| l.name).collect()
}

impl Language {
    /// The code's file name in the request's directory.
    pub fn file_name(&self, stem: &str) -> String {
        match self.source {
            Source::Suffix(s) => format!("{stem}{s}"),
            Source::Fixed(name) => name.to_string(),
        }
    }

    /// The code as written: SandboxFusion's PHP runner strips leading
    /// whitespace (which PHP would print) and adds the opening tag a
    /// snippet leaves out (`ensure_php_tag_in_string`).
    pub fn source_text(&self, code: &str) -> String {
        if self.name != "php" {
            return code.to_string();
        }
        let code = code.trim_start();
        if code.starts_with("<?php") {
            code.to_string()
        } else {
            format!("<?php\n{code}")
        }
    }

    /// A command with its placeholders filled in.
    pub fn argv(&self, template: &[&str], file: &str, dir: &str, classpath: &str) -> Vec<String> {
        template
            .iter()
            .map(|a| {
                a.replace("{file}", file)
                    .replace("{dir}", dir)
                    .replace("{cp}", classpath)
            })
            .collect()
    }
}

/// Jars an image bundles for Java calls, as SandboxFusion bundles
/// javatuples-1.2.jar: javac and java expand the wildcard themselves and
/// skip it when the directory does not exist.
pub const BUNDLED_JARS: &str = "/opt/sandbox-fusion/java/*";

/// Java's class path: the directory, every jar the request brought, then
/// the image's bundled jars.
pub fn java_classpath<'a>(files: impl Iterator<Item = &'a str>) -> String {
    let mut cp = vec![".".to_string()];
    cp.extend(files.filter(|f| f.ends_with(".jar")).map(str::to_string));
    cp.push(BUNDLED_JARS.to_string());
    cp.join(":")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_runner_is_a_sandbox_fusion_language() {
        for l in LANGUAGES {
            assert!(SANDBOX_FUSION_LANGUAGES.contains(&l.name), "{}", l.name);
        }
        assert_eq!(SANDBOX_FUSION_LANGUAGES.len(), 29);
    }

    #[test]
    fn lookups() {
        assert!(matches!(lookup("python"), Lookup::Runs(l) if l.compile.is_none()));
        assert!(matches!(lookup("cpp"), Lookup::Runs(l) if l.compile.is_some()));
        assert!(matches!(lookup("junit"), Lookup::NotRun));
        // SandboxFusion's runner table knows `js`, but its request model
        // does not: a 422 there.
        assert!(matches!(lookup("js"), Lookup::Unknown));
        assert!(matches!(lookup("cobol"), Lookup::Unknown));
    }

    #[test]
    fn commands() {
        let Lookup::Runs(cpp) = lookup("cpp") else {
            panic!()
        };
        let f = cpp.file_name("tmpab12");
        assert_eq!(f, "tmpab12.cpp");
        assert_eq!(
            cpp.argv(cpp.compile.unwrap(), "/w/tmpab12.cpp", "/w", "."),
            ["g++", "-std=c++17", "/w/tmpab12.cpp", "-o", "test"]
        );
        assert_eq!(cpp.argv(cpp.run, "/w/x.cpp", "/w", "."), ["/w/test"]);
        let Lookup::Runs(java) = lookup("java") else {
            panic!()
        };
        assert_eq!(java.file_name("x"), "Main.java");
        let cp = java_classpath(["a.jar", "b.txt", "lib/c.jar"].into_iter());
        assert_eq!(cp, ".:a.jar:lib/c.jar:/opt/sandbox-fusion/java/*");
        assert_eq!(
            java.argv(java.run, "", "/w", &cp),
            [
                "java",
                "-cp",
                ".:a.jar:lib/c.jar:/opt/sandbox-fusion/java/*",
                "-ea",
                "Main"
            ]
        );
        let Lookup::Runs(php) = lookup("php") else {
            panic!()
        };
        assert_eq!(php.source_text("echo 1;"), "<?php\necho 1;");
        assert_eq!(php.source_text("<?php echo 1;"), "<?php echo 1;");
        assert_eq!(php.source_text("\n  <?php echo 1;"), "<?php echo 1;");
    }
}
