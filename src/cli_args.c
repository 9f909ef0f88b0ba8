/* cli_args.c - argv against the tables of cli.c (see cli_args.h): one
 * parser for the daemon's command line and every subcommand.
 *
 * One pass over argv. The first word that is not an option names the
 * command (a command with verbs takes the next as its verb), the rest are
 * its operands; an option may stand anywhere and sets its field of struct
 * cli_args through the table. The first mistake is remembered, not printed:
 * once the whole line is read, --help (for a known command) wins over it,
 * and the message can name the command even when options came before it.
 * After the loop come the checks that need the whole line: operands missing
 * (or, for a verb, their exact count) and options of another command.
 *
 * Which words a mistake gets depends on the command's family (enum
 * cli_style); so does where an option of another command is caught: in
 * the words of CLI_STYLE_MORE it is an unknown option where it stands.
 * Once the command is known, an option that no command of its family takes
 * is unknown where it stands, and its value is not taken; one given before
 * the command's name is judged the same way after the loop, by position. */
#include "cli_args.h"

#include <assert.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

#define MAX_OPTIONS 64

enum slip_kind {
	SLIP_NONE,
	SLIP_UNKNOWN_COMMAND,
	SLIP_UNKNOWN_OPTION, /* arg as given, len its name part */
	SLIP_TWICE,
	SLIP_NO_VALUE,
	SLIP_NEEDS_VALUE, /* arg as given, len its name part */
	SLIP_UNEXPECTED,
};

/* A mistake met in the loop, where it stands (argv index). */
struct slip {
	enum slip_kind kind;
	int at;
	const char *arg;
	size_t len;
	const struct cli_option *o;
};

static void note(struct slip *s, enum slip_kind kind, int at, const char *arg, size_t len,
		 const struct cli_option *o)
{
	if (s->kind != SLIP_NONE)
		return;
	*s = (struct slip){kind, at, arg, len, o};
}

static const struct cli_command *find_command(const struct cli_command *t, size_t n,
					      const char *name)
{
	for (size_t i = 0; i < n; i++)
		if (strcmp(t[i].name, name) == 0)
			return &t[i];
	return NULL;
}

/* The option spelled s ("--group", "-c", "--group=x": *len is the length of
 * the name part), or NULL. */
static const struct cli_option *find_option(const struct cli_grammar *g, const char *s, size_t *len)
{
	*len = strcspn(s, "=");
	for (size_t i = 0; i < g->noptions; i++) {
		const struct cli_option *o = &g->options[i];
		if ((strlen(o->name) == *len && strncmp(s, o->name, *len) == 0) ||
		    (o->alias && strlen(o->alias) == *len && strncmp(s, o->alias, *len) == 0))
			return o;
	}
	return NULL;
}

/* The bits of every command of c's family: its verbs' (and its own, when
 * it runs without a verb too), or those of the commands that share its
 * style. */
static unsigned family_bits(const struct cli_grammar *g, const struct cli_command *c)
{
	unsigned bits = 0;
	if (c->verbs) {
		bits = c->bit;
		for (size_t i = 0; i < c->nverbs; i++)
			bits |= c->verbs[i].bit;
		return bits;
	}
	for (size_t i = 0; i < g->ncommands; i++)
		if (g->commands[i].style == c->style)
			bits |= g->commands[i].bit;
	return bits;
}

/* Is o, given to c, an unknown option where it stands? */
static bool is_unknown_for(const struct cli_option *o, const struct cli_command *c, unsigned family)
{
	return !(o->cmds & family) || (c->style == CLI_STYLE_MORE && !(o->cmds & c->bit));
}

static bool is_number_word(const char *s)
{
	return s[0] >= '0' && s[0] <= '9';
}

/* The word of `operands` ("ROLE QUEUE", "ID...") for operand number i, into
 * buf, without a trailing "...". */
static const char *operand_word(const char *operands, int i, char *buf, size_t size)
{
	const char *p = operands;
	for (int k = 0; k < i && strchr(p, ' '); k++)
		p = strchr(p, ' ') + 1;
	size_t n = strcspn(p, " .");
	snprintf(buf, size, "%.*s", (int)n, p);
	return buf;
}

/* "add, list, rm, run-now, pause or resume". */
static void verb_list(const struct cli_command *c, char *buf, size_t size)
{
	size_t n = 0;
	buf[0] = '\0';
	for (size_t i = 0; i < c->nverbs && n < size; i++)
		n += (size_t)snprintf(buf + n, size - n, "%s%s",
				      i == 0		   ? ""
				      : i + 1 == c->nverbs ? " or "
							   : ", ",
				      c->verbs[i].name);
}

/* "OPT is an option of ..." in c's words: the commands of its family (the
 * verbs of c) that take o. */
static void foreign_option(const struct cli_grammar *g, const struct cli_command *c,
			   const struct cli_option *o, char *msg, size_t size)
{
	char owners[256] = "";
	if (c->verbs && (o->cmds & c->bit)) {
		snprintf(msg, size, "%s is an option of %s without a verb", o->name, c->name);
		return;
	}
	const struct cli_command *t = c->verbs ? c->verbs : g->commands;
	size_t nt = c->verbs ? c->nverbs : g->ncommands;
	for (size_t i = 0; i < nt; i++) {
		if (!(o->cmds & t[i].bit) || (!c->verbs && t[i].style != c->style))
			continue;
		size_t n = strlen(owners);
		snprintf(owners + n, sizeof(owners) - n, "%s%s",
			 n ? (c->verbs ? " " : " and ") : "", t[i].name);
	}
	snprintf(msg, size, "%s is an option of %s%s%s", o->name, c->verbs ? c->name : "",
		 c->verbs ? " " : "", owners);
}

/* The message of a mistake met in the loop, in c's words (c NULL: an
 * unknown command). */
static void describe(const struct slip *s, const struct cli_command *c, char *msg, size_t size)
{
	enum cli_style style = c ? c->style : CLI_STYLE_TRY;
	switch (s->kind) {
	case SLIP_UNKNOWN_COMMAND:
		snprintf(msg, size, "unknown command '%s'", s->arg);
		break;
	case SLIP_UNKNOWN_OPTION:
		if (style == CLI_STYLE_MORE)
			snprintf(msg, size, "unknown option '%.*s'", (int)s->len, s->arg);
		else
			snprintf(msg, size, "unknown option '%s'", s->arg);
		break;
	case SLIP_TWICE:
		snprintf(msg, size, "option %s given twice", s->o->name);
		break;
	case SLIP_NO_VALUE:
		snprintf(msg, size, "option %s takes no value", s->o->name);
		break;
	case SLIP_NEEDS_VALUE:
		if (style == CLI_STYLE_USAGE)
			snprintf(msg, size, "option %.*s needs a value", (int)s->len, s->arg);
		else
			snprintf(msg, size, "option %s needs a value", s->o->name);
		break;
	case SLIP_UNEXPECTED:
		snprintf(msg, size, "unexpected argument '%s'", s->arg);
		break;
	case SLIP_NONE:
		msg[0] = '\0';
		break;
	}
}

/* The checks that need the whole line, for command c after a loop without
 * a mistake: its verb, how many operands it got, options of other
 * commands. Sets a->action. Returns true after writing the first problem
 * into msg. */
static bool judge_line(const struct cli_grammar *g, const struct cli_command *c, const int *at,
		       struct cli_args *a, char *msg, size_t size)
{
	const struct cli_command *act = c;
	char word[64];
	if (c->verbs) {
		verb_list(c, word, sizeof(word));
		if (!a->verb && !c->run) {
			snprintf(msg, size, "missing %s (%s)", c->operands, word);
			return true;
		}
		/* A command with verbs and a run of its own runs it without a
		 * verb (groups: the listing). */
		if (a->verb)
			act = find_command(c->verbs, c->nverbs, a->verb);
		if (!act) {
			snprintf(msg, size, "unknown verb '%s' (use %s)", a->verb, word);
			return true;
		}
		if (act != c && a->noperands != act->min_operands) {
			snprintf(msg, size, "%s takes %s%s", act->name,
				 act->min_operands ? act->operands : "no operand",
				 a->noperands < act->min_operands ? "" : " only");
			return true;
		}
	} else if (a->noperands < c->min_operands) {
		snprintf(msg, size, "missing %s",
			 operand_word(c->operands, a->noperands, word, sizeof(word)));
		return true;
	}
	a->action = act;
	for (size_t i = 0; i < g->noptions; i++)
		if (at[i] && !(g->options[i].cmds & act->bit)) {
			foreign_option(g, c, &g->options[i], msg, size);
			return true;
		}
	return false;
}

enum cli_parsed cli_args_parse(const struct cli_grammar *g, int argc, char **argv,
			       struct cli_args *a)
{
	const char **operands = xcalloc((size_t)argc + 1, sizeof(char *));
	*a = (struct cli_args){.config = CLI_DEFAULT_CONFIG, .operands = operands};
	const struct cli_command *c = NULL;
	unsigned family = 0;
	int at[MAX_OPTIONS] = {0}; /* where each option was given; 0: not */
	struct slip first = {0};
	bool end = false, help = false;
	assert(g->noptions <= MAX_OPTIONS);
	for (int i = 1; i < argc; i++) {
		const char *s = argv[i];
		if (end || s[0] != '-' || s[1] == '\0') {
			if (!c) {
				c = find_command(g->commands, g->ncommands, s);
				if (!c) {
					note(&first, SLIP_UNKNOWN_COMMAND, i, s, 0, NULL);
					break; /* nothing after it can be judged */
				}
				family = family_bits(g, c);
			} else if (c->verbs && !a->verb) {
				a->verb = s;
			} else if (c->max_operands < 0 || a->noperands < c->max_operands) {
				operands[a->noperands++] = s;
			} else {
				note(&first, SLIP_UNEXPECTED, i, s, 0, NULL);
			}
			continue;
		}
		if (strcmp(s, "--") == 0) {
			end = true;
			continue;
		}
		if (strcmp(s, "--help") == 0 || strcmp(s, "-h") == 0) {
			help = true;
			continue;
		}
		if (strcmp(s, "--version") == 0 || strcmp(s, "-V") == 0)
			return CLI_PARSED_VERSION;
		size_t len;
		const struct cli_option *o = find_option(g, s, &len);
		if (!o || (c && is_unknown_for(o, c, family))) {
			note(&first, SLIP_UNKNOWN_OPTION, i, s, len, NULL);
			continue;
		}
		size_t oi = (size_t)(o - g->options);
		/* A repeated option is a mistake more often than an override. */
		if (at[oi])
			note(&first, SLIP_TWICE, i, s, len, o);
		else
			at[oi] = i;
		char *field = (char *)a + o->offset;
		if (o->value == CLI_FLAG) {
			if (s[len] == '=')
				note(&first, SLIP_NO_VALUE, i, s, len, o);
			*(bool *)field = true;
		} else if (s[len] == '=') {
			*(const char **)field = s + len + 1;
		} else if (o->value == CLI_OPTIONAL_WORD) {
			*(const char **)field =
			    i + 1 < argc && is_number_word(argv[i + 1]) ? argv[++i] : "";
		} else if (i + 1 < argc) {
			*(const char **)field = argv[++i];
		} else {
			note(&first, SLIP_NEEDS_VALUE, i, s, len, o);
		}
	}
	if (help && (c || first.kind == SLIP_NONE)) {
		a->command = c;
		return CLI_PARSED_HELP;
	}
	if (first.kind == SLIP_UNKNOWN_COMMAND) {
		cli_args_usage_error(a, "unknown command '%s'", first.arg);
		return CLI_PARSED_ERROR;
	}
	if (!c) {
		c = find_command(g->commands, g->ncommands, g->default_command);
		family = family_bits(g, c);
	}
	a->command = c;
	a->cmd = c->name;
	a->operand = a->noperands > 0 ? operands[0] : NULL;
	a->operand2 = a->noperands > 1 ? operands[1] : NULL;
	/* Options given before the command's name, judged as if they had
	 * come after it: unknown where they stand. */
	for (size_t i = 0; i < g->noptions; i++) {
		bool earlier = first.kind == SLIP_NONE || at[i] < first.at;
		if (at[i] && earlier && is_unknown_for(&g->options[i], c, family)) {
			first = (struct slip){.kind = SLIP_UNKNOWN_OPTION, .at = at[i]};
			first.arg = argv[at[i]];
			first.len = strcspn(first.arg, "=");
		}
	}
	char msg[512];
	describe(&first, c, msg, sizeof(msg));
	if (first.kind != SLIP_NONE || judge_line(g, c, at, a, msg, sizeof(msg))) {
		cli_args_usage_error(a, "%s", msg);
		return CLI_PARSED_ERROR;
	}
	return CLI_PARSED_RUN;
}

void cli_args_fini(struct cli_args *a)
{
	free((void *)a->operands);
	a->operands = NULL;
}

int cli_args_usage_error(const struct cli_args *a, const char *fmt, ...)
{
	const struct cli_command *c = a->command;
	char msg[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (!c) {
		fprintf(stderr, "pgjobd: %s; try 'pgjobd --help'\n", msg);
		return CLI_USAGE;
	}
	switch (c->style) {
	case CLI_STYLE_TRY:
		fprintf(stderr, "pgjobd: %s: %s; try 'pgjobd %s --help'\n", c->name, msg, c->name);
		break;
	case CLI_STYLE_MORE:
		fprintf(stderr, "pgjobd: %s: %s\nTry 'pgjobd %s --help' for more information.\n",
			c->name, msg, c->name);
		break;
	case CLI_STYLE_USAGE:
		fprintf(stderr, "pgjobd: %s: %s\n%s", c->name, msg, c->usage ? c->usage : c->help);
		break;
	}
	return CLI_USAGE;
}
