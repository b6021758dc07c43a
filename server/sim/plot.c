/* strata-sim: SVG plots drawn by the project itself — lines with a band
 * (accuracy against bytes, one line per policy, the band spanning the
 * seeds) and a heat map (per-layer density, layer × round). Plain SVG 1.1
 * that any browser shows; no library. */
#include "sim.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define W 720
#define H 440
#define ML 70 /* left margin */
#define MR 190
#define MT 40
#define MB 55

static const char *const COLOURS[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e",
                                      "#9467bd", "#8c564b", "#e377c2", "#17becf"};
#define NCOLOURS (sizeof(COLOURS) / sizeof(COLOURS[0]))

/* Writes s with the five XML specials escaped. */
static void xml_text(FILE *f, const char *s)
{
    for (; *s; s++)
        switch (*s) {
        case '<':
            fputs("&lt;", f);
            break;
        case '>':
            fputs("&gt;", f);
            break;
        case '&':
            fputs("&amp;", f);
            break;
        case '"':
            fputs("&quot;", f);
            break;
        case '\'':
            fputs("&apos;", f);
            break;
        default:
            fputc(*s, f);
        }
}

static void header(FILE *f, int w, int h, const char *title)
{
    fprintf(f,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
            "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"12\">\n"
            "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
            "<text x=\"%d\" y=\"22\" font-size=\"14\" text-anchor=\"middle\">",
            w, h, w, h, w / 2);
    xml_text(f, title);
    fputs("</text>\n", f);
}

/* Whether point i of ln is drawn: x on the log axis, y known. */
static int drawn(const sim_plot_line *ln, size_t i)
{
    return ln->x[i] > 0 && isfinite(ln->y[i]) && isfinite(ln->lo[i]) && isfinite(ln->hi[i]);
}

int sim_plot_lines(const char *path, const char *title, const char *xlabel, const char *ylabel,
                   const sim_plot_line *lines, size_t nlines)
{
    double xmin = INFINITY, xmax = -INFINITY, ymin = INFINITY, ymax = -INFINITY;
    for (size_t l = 0; l < nlines; l++)
        for (size_t i = 0; i < lines[l].n; i++) {
            double x = lines[l].x[i];
            if (!drawn(&lines[l], i))
                continue;
            xmin = fmin(xmin, x);
            xmax = fmax(xmax, x);
            ymin = fmin(ymin, lines[l].lo[i]);
            ymax = fmax(ymax, lines[l].hi[i]);
        }
    if (!(xmin <= xmax) || !(ymin <= ymax))
        return STRATA_EINVAL;
    /* Log-scaled x over whole decades, y over steps of 0.05. */
    double lx0 = floor(log10(xmin)), lx1 = ceil(log10(xmax));
    if (lx1 <= lx0)
        lx1 = lx0 + 1;
    double step = ymax - ymin > 0.35 ? 0.1 : 0.05;
    double y0 = floor(ymin / step + 1e-9) * step, y1 = ceil(ymax / step - 1e-9) * step;
    if (y1 <= y0)
        y1 = y0 + step;
    FILE *f = fopen(path, "w");
    if (f == NULL)
        return STRATA_EIO;
    const double pw = W - ML - MR, ph = H - MT - MB;
#define PX(x) (ML + (log10(x) - lx0) / (lx1 - lx0) * pw)
#define PY(y) (MT + (1 - ((y)-y0) / (y1 - y0)) * ph)
    header(f, W, H, title);
    fprintf(f,
            "<rect x=\"%d\" y=\"%d\" width=\"%.0f\" height=\"%.0f\" fill=\"none\" "
            "stroke=\"#444\"/>\n",
            ML, MT, pw, ph);
    for (double d = lx0; d <= lx1 + 1e-9; d++) {
        double x = ML + (d - lx0) / (lx1 - lx0) * pw;
        fprintf(f,
                "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%.0f\" stroke=\"#ddd\"/>\n"
                "<text x=\"%.1f\" y=\"%.0f\" text-anchor=\"middle\">1e%.0f</text>\n",
                x, MT, x, MT + ph, x, MT + ph + 16, d);
    }
    for (double y = y0; y <= y1 + 1e-9; y += step)
        fprintf(f,
                "<line x1=\"%d\" y1=\"%.1f\" x2=\"%.0f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n"
                "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%.2f</text>\n",
                ML, PY(y), ML + pw, PY(y), ML - 6, PY(y) + 4, y);
    fprintf(f, "<text x=\"%.0f\" y=\"%d\" text-anchor=\"middle\">", ML + pw / 2, H - 12);
    xml_text(f, xlabel);
    fprintf(f,
            "</text>\n<text x=\"16\" y=\"%.0f\" text-anchor=\"middle\" "
            "transform=\"rotate(-90 16 %.0f)\">",
            MT + ph / 2, MT + ph / 2);
    xml_text(f, ylabel);
    fputs("</text>\n", f);
    for (size_t l = 0; l < nlines; l++) {
        const sim_plot_line *ln = &lines[l];
        const char *c = COLOURS[l % NCOLOURS];
        /* The band: lo forwards, hi backwards. */
        fprintf(f, "<polygon fill=\"%s\" fill-opacity=\"0.18\" stroke=\"none\" points=\"", c);
        for (size_t i = 0; i < ln->n; i++)
            if (drawn(ln, i))
                fprintf(f, "%.1f,%.1f ", PX(ln->x[i]), PY(ln->lo[i]));
        for (size_t i = ln->n; i-- > 0;)
            if (drawn(ln, i))
                fprintf(f, "%.1f,%.1f ", PX(ln->x[i]), PY(ln->hi[i]));
        fprintf(f, "\"/>\n<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"", c);
        for (size_t i = 0; i < ln->n; i++)
            if (drawn(ln, i))
                fprintf(f, "%.1f,%.1f ", PX(ln->x[i]), PY(ln->y[i]));
        double ly = MT + 14 + 18.0 * (double)l;
        fprintf(f,
                "\"/>\n<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"%s\" "
                "stroke-width=\"3\"/>\n<text x=\"%.0f\" y=\"%.0f\">",
                ML + pw + 12, ly, ML + pw + 34, ly, c, ML + pw + 40, ly + 4);
        xml_text(f, ln->label);
        fputs("</text>\n", f);
    }
#undef PX
#undef PY
    fputs("</svg>\n", f);
    return fclose(f) == 0 ? STRATA_OK : STRATA_EIO;
}

/* A colour for t in [0, 1], from dark blue through green to yellow. */
static void ramp(double t, char out[8])
{
    static const double STOPS[][3] = {
        {68, 1, 84}, {59, 82, 139}, {33, 145, 140}, {94, 201, 98}, {253, 231, 37}};
    t = t < 0 ? 0 : t > 1 ? 1 : t;
    double s = t * 4;
    int k = s >= 4 ? 3 : (int)s;
    double u = s - k;
    int rgb[3];
    for (int c = 0; c < 3; c++)
        rgb[c] = (int)lround(STOPS[k][c] + (STOPS[k + 1][c] - STOPS[k][c]) * u);
    snprintf(out, 8, "#%02x%02x%02x", rgb[0], rgb[1], rgb[2]);
}

int sim_plot_heatmap(const char *path, const char *title, const char *const *rows, size_t nrows,
                     size_t ncols, const double *v)
{
    double lo = INFINITY, hi = -INFINITY;
    for (size_t i = 0; i < nrows * ncols; i++)
        if (v[i] > 0) {
            lo = fmin(lo, v[i]);
            hi = fmax(hi, v[i]);
        }
    if (nrows == 0 || ncols == 0 || !(lo <= hi))
        return STRATA_EINVAL;
    const int label_w = 170, cell_h = 14, legend = 60;
    double cell_w = fmax(2.0, 600.0 / (double)ncols);
    int w = label_w + (int)ceil(cell_w * (double)ncols) + legend + 20;
    int h = MT + cell_h * (int)nrows + 50;
    if (h < MT + 140)
        h = MT + 140; /* room for the legend */
    FILE *f = fopen(path, "w");
    if (f == NULL)
        return STRATA_EIO;
    header(f, w, h, title);
    double llo = log10(lo), lhi = log10(hi);
    for (size_t r = 0; r < nrows; r++) {
        double y = MT + (double)(r * (size_t)cell_h);
        fprintf(f, "<text x=\"%d\" y=\"%.0f\" text-anchor=\"end\" font-size=\"10\">", label_w - 6,
                y + cell_h - 3);
        xml_text(f, rows[r]);
        fputs("</text>\n", f);
        for (size_t c = 0; c < ncols; c++) {
            double d = v[r * ncols + c];
            char col[8] = "#ffffff";
            if (d > 0)
                ramp(lhi > llo ? (log10(d) - llo) / (lhi - llo) : 1.0, col);
            fprintf(f,
                    "<rect x=\"%.1f\" y=\"%.0f\" width=\"%.2f\" height=\"%d\" fill=\"%s\">"
                    "<title>round %zu: %.6g</title></rect>\n",
                    label_w + cell_w * (double)c, y, cell_w + 0.3, cell_h, col, c, d);
        }
    }
    double bottom = MT + (double)(nrows * (size_t)cell_h);
    fprintf(f, "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"middle\">round (0 .. %zu)</text>\n",
            label_w + cell_w * (double)ncols / 2, bottom + 20, ncols - 1);
    /* The legend: the density scale, log-spaced. */
    double lx = label_w + cell_w * (double)ncols + 14;
    for (int i = 0; i < 10; i++) {
        char col[8];
        ramp(1 - i / 9.0, col);
        fprintf(f, "<rect x=\"%.0f\" y=\"%d\" width=\"14\" height=\"10\" fill=\"%s\"/>\n", lx,
                MT + i * 10, col);
    }
    fprintf(f,
            "<text x=\"%.0f\" y=\"%d\" font-size=\"10\">%.3g</text>\n"
            "<text x=\"%.0f\" y=\"%d\" font-size=\"10\">%.3g</text>\n"
            "<text x=\"%.0f\" y=\"%d\" font-size=\"10\">density</text>\n",
            lx, MT - 4, hi, lx, MT + 112, lo, lx, MT + 126);
    fputs("</svg>\n", f);
    return fclose(f) == 0 ? STRATA_OK : STRATA_EIO;
}
