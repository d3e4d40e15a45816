/*
 * svg.h — the one small SVG writer every figure strata draws goes through:
 * the sweep's steps-to-target curve (lab/sweep.c), the pipelined-backprop
 * experiment's accuracy curves (lab/experiment.c) and the plan's map
 * (compile/report.c). A figure is a document (st_svg_begin .. st_svg_end);
 * a chart is a framed plot area with its data ranges, where st_svg_x/y map
 * data to pixels and the grid, curves, points and legend rows are drawn in
 * one style. Writes to a FILE (an open_memstream, written atomically by the
 * caller); nothing here fails.
 */
#ifndef STRATA_IO_SVG_H
#define STRATA_IO_SVG_H

#include <stdio.h>

/* <svg> of w x h pixels with a white background, text in `font` at `size`
 * pixels (0: the viewer's default). */
void st_svg_begin(FILE *f, double w, double h, const char *font, int size);
void st_svg_end(FILE *f);
/* s with XML's special characters escaped; a byte that starts no valid
 * UTF-8 sequence, and a control character XML 1.0 cannot hold, as U+FFFD
 * (a path cut short mid-character, a name from a YAML escape). */
void st_svg_escape(FILE *f, const char *s);
/* The length of the valid UTF-8 sequence s starts with (1 to 4), 0 if it
 * starts none (an overlong form, a surrogate, past U+10FFFF, cut short). */
int st_utf8_len(const char *s);

/* A line's look: colour, width (NULL: 1) and dash pattern (NULL: solid). */
typedef struct st_svg_pen {
  const char *color, *width, *dash;
} st_svg_pen;

void st_svg_line(FILE *f, double x1, double y1, double x2, double y2,
                 st_svg_pen pen);
void st_svg_rect(FILE *f, double x, double y, double w, double h,
                 const char *fill, const char *stroke);
void st_svg_circle(FILE *f, double cx, double cy, double r, const char *fill);
/* A polyline, one line of the file: begin, its points, end. */
void st_svg_poly_begin(FILE *f, st_svg_pen pen);
void st_svg_poly_point(FILE *f, int first, double x, double y);
void st_svg_poly_end(FILE *f);

/* A plot: W x H pixels, the frame inset by the margins L, R, T, B (the
 * legend sits in the right margin), data x0 .. x1 across and y0 .. y1 up
 * (what the caller plots: log10 of a value for a log axis). */
typedef struct st_svg_chart {
  FILE *f;
  int W, H, L, R, T, B;
  double x0, x1, y0, y1;
  int legend_rows;
} st_svg_chart;

double st_svg_x(const st_svg_chart *c, double x);
double st_svg_y(const st_svg_chart *c, double y);
/* The document, its title (escaped) and the axis labels. */
void st_svg_chart_begin(st_svg_chart *c, const char *title, const char *xlabel,
                        const char *ylabel);
/* The frame, drawn over whatever fills the plot, and the document's end. */
void st_svg_chart_end(st_svg_chart *c);
/* A grid line across the frame at data x (vertical) or y (horizontal),
 * with its tick label (NULL: none). */
void st_svg_grid_x(const st_svg_chart *c, double x, const char *color,
                   const char *label);
void st_svg_grid_y(const st_svg_chart *c, double y, const char *color,
                   const char *label);
/* A text label at data x, just inside the top of the frame. */
void st_svg_mark_x(const st_svg_chart *c, double x, const char *fill,
                   const char *text);
/* The next legend row: a stroke sample drawn with pen, or a swatch filled
 * with fill when pen.color is NULL, or neither (both NULL); then the text. */
void st_svg_legend(st_svg_chart *c, st_svg_pen pen, const char *fill,
                   const char *text_color, const char *text);

#endif
