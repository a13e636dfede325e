//! The font of every plot (`rocev2 cc trace --plot`, `rocev2 perf --rate-log`): plotters draws text through
//! `ab_glyph` with a TrueType font registered at run time, so no fontconfig is needed (`docs/DEPENDENCIES.md`, gotcha
//! 2). The font is DejaVu Sans from the system (Debian: `fonts-dejavu-core`, installed by `.ci/run` when missing)
//! or the file named by `ROCEV2_PLOT_FONT`.

use std::sync::OnceLock;

/// Where a sans-serif TTF usually is.
const CANDIDATES: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/truetype/freefont/FreeSans.ttf",
];

/// Registers the font as plotters' "sans-serif" (once per process).
///
/// # Errors
/// No font file found or readable, or plotters rejects it; the message says what to install.
pub fn register() -> Result<(), String> {
    static DONE: OnceLock<Result<(), String>> = OnceLock::new();
    DONE.get_or_init(|| {
        let path = match std::env::var_os("ROCEV2_PLOT_FONT") {
            Some(p) => std::path::PathBuf::from(p),
            None => CANDIDATES
                .iter()
                .map(std::path::PathBuf::from)
                .find(|p| p.is_file())
                .ok_or_else(|| {
                    "no TrueType font for the plot: install fonts-dejavu-core or set ROCEV2_PLOT_FONT=FILE.ttf"
                        .to_owned()
                })?,
        };
        let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        // plotters keeps the font for the life of the process.
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        plotters::style::register_font("sans-serif", plotters::style::FontStyle::Normal, bytes)
            .map_err(|_| format!("{}: not a usable TrueType font", path.display()))
    })
    .clone()
}
