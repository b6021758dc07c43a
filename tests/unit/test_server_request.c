#include "request.h"

#include <jansson.h>
#include "test_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers ------------------------------------------------------------ */

/* A body given as a literal, embedded NUL bytes included. */
#define B(s) s, sizeof(s) - 1

/* The same as a (const uint8_t *) argument pair. */
#define U(s) (const uint8_t *)s, sizeof(s) - 1

/* 1 when every byte of s is printable ASCII (diags go back to clients). */
static int printable_ascii(const char *s)
{
    for (; *s; s++)
        if (*s < 0x20 || *s > 0x7e)
            return 0;
    return 1;
}

static int all_zero(const void *p, size_t n)
{
    const unsigned char *u = p;
    for (size_t i = 0; i < n; i++)
        if (u[i] != 0)
            return 0;
    return 1;
}

/* Checks rc and, on error, that diag is non-empty, printable and contains
 * want (when not NULL). */
static void check_outcome(const char *what, int rc, int want_rc, const strata_diag *d,
                          const char *want)
{
    if (rc != want_rc)
        fprintf(stderr, "\n  %s: rc %d (%s), expected %d\n", what, rc, d->msg, want_rc);
    CU_ASSERT_EQUAL(rc, want_rc);
    if (rc < 0) {
        CU_ASSERT(d->msg[0] != '\0');
        CU_ASSERT(printable_ascii(d->msg));
        if (want != NULL && strstr(d->msg, want) == NULL) {
            fprintf(stderr, "\n  %s: message \"%s\" lacks \"%s\"\n", what, d->msg, want);
            CU_FAIL("diag message");
        }
    }
}

/* "{"a":" ... nested to depth containers in total, the innermost being {}
 * (objects) or [] inside the top-level object (arrays). malloc'ed. */
static char *nested(size_t depth, int arrays)
{
    size_t cap = 8 * depth + 16;
    char *s = malloc(cap), *p = s;
    if (s == NULL)
        return NULL;
    if (arrays) {
        p += sprintf(p, "{\"a\":");
        for (size_t i = 1; i < depth; i++)
            *p++ = '[';
        for (size_t i = 1; i < depth; i++)
            *p++ = ']';
        if (depth == 1)
            p += sprintf(p, "1");
        *p++ = '}';
    } else {
        for (size_t i = 1; i < depth; i++)
            p += sprintf(p, "{\"a\":");
        p += sprintf(p, "{}");
        for (size_t i = 1; i < depth; i++)
            *p++ = '}';
    }
    *p = '\0';
    return s;
}

/* {"<key>":"<n times c>"}, strlen(key) + n + 8 bytes; malloc'ed. */
static char *string_body(const char *key, char c, size_t n)
{
    size_t cap = strlen(key) + n + 16;
    char *s = malloc(cap);
    if (s == NULL)
        return NULL;
    int k = sprintf(s, "{\"%s\":\"", key);
    memset(s + k, c, n);
    strcpy(s + k + n, "\"}");
    return s;
}

/* ---- srv_json_parse ----------------------------------------------------- */

typedef struct {
    const char *what;
    const char *body;
    size_t len;
    int rc;
    const char *msg; /* a substring of the diag, or NULL */
} parse_case;

static const parse_case parse_cases[] = {
    {"empty object", B("{}"), STRATA_OK, NULL},
    {"empty body is an empty object", B(""), STRATA_OK, NULL},
    {"object with values", B("{\"a\": [1, 2.5, true, null, {\"b\": \"c\"}]}"), STRATA_OK, NULL},
    {"white space around", B(" \n\t{}\r\n "), STRATA_OK, NULL},
    {"brackets inside a string do not nest", B("{\"a\": \"[[[[[[[[[[[[[[[[[[[[{{{{{{{{{{\"}"),
     STRATA_OK, NULL},
    {"escaped quote keeps the string open",
     B("{\"a\": \"\\\"[[[[[[[[[[[[[[[[[[[[\\\\\", \"b\": \"\\\\\\\"{{{{{{{{{{{{{{{{{{{{\"}"),
     STRATA_OK, NULL},
    {"brackets in a key do not nest", B("{\"{{{{{{{{{{{{{{{{{{{{\": 1}"), STRATA_OK, NULL},
    {"unicode escapes", B("{\"a\": \"\\u00e9\\ud83d\\ude00\"}"), STRATA_OK, NULL},
    {"only white space", B("  "), STRATA_EPROTO, "not valid JSON"},
    {"array at the top", B("[]"), STRATA_EPROTO, "expected a JSON object"},
    {"number at the top", B("1"), STRATA_EPROTO, "not valid JSON"},
    {"string at the top", B("\"s\""), STRATA_EPROTO, "not valid JSON"},
    {"null at the top", B("null"), STRATA_EPROTO, "not valid JSON"},
    {"duplicate key", B("{\"a\": 1, \"a\": 2}"), STRATA_EPROTO, "duplicate"},
    {"invalid UTF-8", B("{\"a\": \"\xff\"}"), STRATA_EPROTO, "not valid JSON"},
    {"overlong UTF-8", B("{\"a\": \"\xc0\xaf\"}"), STRATA_EPROTO, "not valid JSON"},
    {"UTF-8 surrogate", B("{\"a\": \"\xed\xa0\x80\"}"), STRATA_EPROTO, "not valid JSON"},
    {"lone surrogate escape", B("{\"a\": \"\\ud800\"}"), STRATA_EPROTO, "not valid JSON"},
    {"escaped NUL", B("{\"a\": \"x\\u0000y\"}"), STRATA_EPROTO, "not valid JSON"},
    {"escaped NUL in a key", B("{\"a\\u0000\": 1}"), STRATA_EPROTO, "not valid JSON"},
    {"raw NUL after the object", B("{}\0"), STRATA_EPROTO, "not valid JSON"},
    {"raw NUL in a string", B("{\"a\": \"x\0y\"}"), STRATA_EPROTO, "not valid JSON"},
    {"raw control character in a string", B("{\"a\": \"x\ny\"}"), STRATA_EPROTO, "not valid JSON"},
    {"trailing bytes", B("{} {}"), STRATA_EPROTO, "not valid JSON"},
    {"truncated", B("{\"a\": 1"), STRATA_EPROTO, "not valid JSON"},
    {"unterminated string", B("{\"a\": \"[[[["), STRATA_EPROTO, "not valid JSON"},
    {"unbalanced closing brackets", B("]]]]{}"), STRATA_EPROTO, "not valid JSON"},
    {"junk with control bytes is quoted safely", B("{\"a\": tr\x01\x02\x1b[2J}"), STRATA_EPROTO,
     "not valid JSON"},
    {"integer too big", B("{\"a\": 123456789012345678901234567890}"), STRATA_EPROTO,
     "not valid JSON"},
};

static void test_parse_table(void)
{
    for (size_t i = 0; i < sizeof(parse_cases) / sizeof(parse_cases[0]); i++) {
        const parse_case *c = &parse_cases[i];
        json_t *root = (json_t *)&root;
        strata_diag d = {{0}};
        int rc = srv_json_parse((const uint8_t *)c->body, c->len, NULL, &root, &d);
        check_outcome(c->what, rc, c->rc, &d, c->msg);
        if (rc == STRATA_OK) {
            CU_ASSERT(json_is_object(root));
        } else {
            CU_ASSERT_PTR_NULL(root);
        }
        json_decref(rc == STRATA_OK ? root : NULL);
    }
}

static void test_parse_size(void)
{
    srv_json_limits lim;
    srv_json_limits_init(&lim);
    CU_ASSERT_EQUAL(lim.max_bytes, 65536);
    CU_ASSERT_EQUAL(lim.max_depth, 16);

    /* {"a":"xxx..."} of exactly max_bytes bytes, then one byte more. */
    char *body = string_body("a", 'x', lim.max_bytes - 8);
    CU_ASSERT_FATAL(body != NULL);
    CU_ASSERT_EQUAL(strlen(body), lim.max_bytes);
    json_t *root = NULL;
    strata_diag d = {{0}};
    check_outcome("exactly max_bytes",
                  srv_json_parse((uint8_t *)body, lim.max_bytes, &lim, &root, &d), STRATA_OK, &d,
                  NULL);
    json_decref(root);
    free(body);

    body = string_body("a", 'x', lim.max_bytes - 7);
    CU_ASSERT_FATAL(body != NULL);
    root = (json_t *)&root;
    check_outcome("max_bytes + 1",
                  srv_json_parse((uint8_t *)body, lim.max_bytes + 1, &lim, &root, &d),
                  STRATA_ETOOBIG, &d, "body of 65537 bytes is above the JSON limit of 65536");
    CU_ASSERT_PTR_NULL(root);
    /* The limit is checked before any byte is read: NULL with a huge length. */
    check_outcome("huge length", srv_json_parse((uint8_t *)body, SIZE_MAX, NULL, &root, &d),
                  STRATA_ETOOBIG, &d, "above the JSON limit");
    free(body);

    /* A smaller limit applies; an empty body passes even a limit of 0. */
    srv_json_limits small = {.max_bytes = 3, .max_depth = 16};
    check_outcome("small limit", srv_json_parse(U("{ }"), &small, &root, &d), STRATA_OK, &d, NULL);
    json_decref(root);
    check_outcome("small limit + 1", srv_json_parse(U("{  }"), &small, &root, &d), STRATA_ETOOBIG,
                  &d, "body of 4 bytes is above the JSON limit of 3");
    small.max_bytes = 0;
    check_outcome("limit 0, empty body", srv_json_parse(NULL, 0, &small, &root, &d), STRATA_OK, &d,
                  NULL);
    json_decref(root);
}

static void test_parse_depth(void)
{
    srv_json_limits lim;
    srv_json_limits_init(&lim);
    for (int arrays = 0; arrays <= 1; arrays++) {
        for (size_t depth = 1; depth <= lim.max_depth + 2; depth++) {
            char *body = nested(depth, arrays);
            CU_ASSERT_FATAL(body != NULL);
            json_t *root = (json_t *)&root;
            strata_diag d = {{0}};
            int rc = srv_json_parse((uint8_t *)body, strlen(body), &lim, &root, &d);
            char what[64];
            snprintf(what, sizeof(what), "%s depth %zu", arrays ? "arrays" : "objects", depth);
            if (depth <= lim.max_depth) {
                check_outcome(what, rc, STRATA_OK, &d, NULL);
                json_decref(root);
            } else {
                check_outcome(what, rc, STRATA_EPROTO, &d, "nesting deeper than 16");
                CU_ASSERT_PTR_NULL(root);
            }
            free(body);
        }
    }

    /* Deep nesting far beyond jansson's own limit is refused by the scan. */
    size_t deep = 30000;
    char *body = malloc(2 * deep + 1);
    CU_ASSERT_FATAL(body != NULL);
    memset(body, '[', deep);
    memset(body + deep, ']', deep);
    json_t *root = NULL;
    strata_diag d = {{0}};
    check_outcome("30000 arrays", srv_json_parse((uint8_t *)body, 2 * deep, NULL, &root, &d),
                  STRATA_EPROTO, &d, "nesting deeper than 16");

    /* The same brackets inside a string are data. */
    memcpy(body, "{\"a\":\"", 6);
    memcpy(body + 2 * deep - 2, "\"}", 2);
    check_outcome("brackets in a long string",
                  srv_json_parse((uint8_t *)body, 2 * deep, NULL, &root, &d), STRATA_OK, &d, NULL);
    json_decref(root);
    free(body);

    /* A custom depth: 1 allows only a flat object. */
    srv_json_limits flat = {.max_bytes = 1024, .max_depth = 1};
    check_outcome("flat ok", srv_json_parse(U("{\"a\":1}"), &flat, &root, &d), STRATA_OK, &d, NULL);
    json_decref(root);
    check_outcome("flat with an array", srv_json_parse(U("{\"a\":[]}"), &flat, &root, &d),
                  STRATA_EPROTO, &d, "nesting deeper than 1");
}

static void test_parse_arguments(void)
{
    json_t *root = (json_t *)&root;
    strata_diag d = {{0}};
    check_outcome("NULL out", srv_json_parse(U("{}"), NULL, NULL, &d), STRATA_EINVAL, &d, NULL);
    check_outcome("NULL body with a length", srv_json_parse(NULL, 2, NULL, &root, &d),
                  STRATA_EINVAL, &d, NULL);
    CU_ASSERT_PTR_NULL(root);
    /* diag may be NULL. */
    CU_ASSERT_EQUAL(srv_json_parse(U("[]"), NULL, &root, NULL), STRATA_EPROTO);
    CU_ASSERT_EQUAL(srv_json_parse(NULL, 0, NULL, &root, NULL), STRATA_OK);
    CU_ASSERT(json_is_object(root) && json_object_size(root) == 0);
    json_decref(root);
}

/* ---- srv_request_register ----------------------------------------------- */

typedef struct {
    const char *what;
    const char *body;
    size_t len;
    int rc;
    const char *msg;    /* a substring of the diag, or NULL */
    const char *name;   /* expected name, NULL when absent */
    const char *secret; /* expected secret on success */
} register_case;

static const register_case register_cases[] = {
    {"secret only", B("{\"enrolment_secret\": \"s3cret\"}"), STRATA_OK, NULL, NULL, "s3cret"},
    {"name and secret", B("{\"name\": \"alice-01\", \"enrolment_secret\": \"k\"}"), STRATA_OK, NULL,
     "alice-01", "k"},
    {"empty name", B("{\"name\": \"\", \"enrolment_secret\": \"k\"}"), STRATA_OK, NULL, "", "k"},
    {"name with every kind of printable",
     B("{\"name\": \" ~!\\\"#$%&'()*+,-./09:;<=>?@AZ[\\\\]^_`az{|}\", \"enrolment_secret\": "
       "\"k\"}"),
     STRATA_OK, NULL, " ~!\"#$%&'()*+,-./09:;<=>?@AZ[\\]^_`az{|}", "k"},
    {"secret in UTF-8 with escapes", B("{\"enrolment_secret\": \"p\\u00e4ss w\\t\\u00f6rd\"}"),
     STRATA_OK, NULL, NULL, "p\xc3\xa4ss w\t\xc3\xb6rd"},
    {"empty body", B(""), STRATA_EPROTO, "enrolment_secret: missing", NULL, NULL},
    {"empty object", B("{}"), STRATA_EPROTO, "enrolment_secret: missing", NULL, NULL},
    {"name only", B("{\"name\": \"a\"}"), STRATA_EPROTO, "enrolment_secret: missing", NULL, NULL},
    {"empty secret", B("{\"enrolment_secret\": \"\"}"), STRATA_EPROTO, "enrolment_secret", NULL,
     NULL},
    {"secret with NUL", B("{\"enrolment_secret\": \"a\\u0000b\"}"), STRATA_EPROTO, "not valid JSON",
     NULL, NULL},
    {"secret a number", B("{\"enrolment_secret\": 1234}"), STRATA_EPROTO,
     "enrolment_secret: expected a string", NULL, NULL},
    {"secret null", B("{\"enrolment_secret\": null}"), STRATA_EPROTO,
     "enrolment_secret: expected a string", NULL, NULL},
    {"secret an object", B("{\"enrolment_secret\": {\"a\": \"b\"}}"), STRATA_EPROTO,
     "enrolment_secret: expected a string", NULL, NULL},
    {"name a number", B("{\"name\": 7, \"enrolment_secret\": \"k\"}"), STRATA_EPROTO,
     "name: expected a string", NULL, NULL},
    {"name an array", B("{\"name\": [\"a\"], \"enrolment_secret\": \"k\"}"), STRATA_EPROTO,
     "name: expected a string", NULL, NULL},
    {"name with a tab", B("{\"name\": \"a\\tb\", \"enrolment_secret\": \"k\"}"), STRATA_EPROTO,
     "name: expected 0 to 64 bytes of printable ASCII", NULL, NULL},
    {"name with a newline", B("{\"name\": \"a\\nb\", \"enrolment_secret\": \"k\"}"), STRATA_EPROTO,
     "name:", NULL, NULL},
    {"name with DEL", B("{\"name\": \"a\\u007fb\", \"enrolment_secret\": \"k\"}"), STRATA_EPROTO,
     "name:", NULL, NULL},
    {"name with ESC", B("{\"name\": \"\\u001b[2J\", \"enrolment_secret\": \"k\"}"), STRATA_EPROTO,
     "name:", NULL, NULL},
    {"name not ASCII", B("{\"name\": \"j\xc3\xb6rg\", \"enrolment_secret\": \"k\"}"), STRATA_EPROTO,
     "name:", NULL, NULL},
    {"name with NUL", B("{\"name\": \"a\\u0000b\", \"enrolment_secret\": \"k\"}"), STRATA_EPROTO,
     "not valid JSON", NULL, NULL},
    {"unknown key", B("{\"nmae\": \"a\", \"enrolment_secret\": \"k\"}"), STRATA_EPROTO,
     "unknown key \"nmae\"", NULL, NULL},
    {"unknown key after valid ones", B("{\"enrolment_secret\": \"k\", \"token\": \"t\"}"),
     STRATA_EPROTO, "unknown key \"token\"", NULL, NULL},
    {"unknown key with control characters is quoted safely",
     B("{\"a\\u001b\\n\": 1, \"enrolment_secret\": \"k\"}"), STRATA_EPROTO, "unknown key \"a??\"",
     NULL, NULL},
    {"key differing in case", B("{\"Enrolment_Secret\": \"k\"}"), STRATA_EPROTO, "unknown key",
     NULL, NULL},
    {"registration id",
     B("{\"enrolment_secret\": \"k\", \"registration_id\": \"0123456789abcdef\"}"), STRATA_OK, NULL,
     NULL, "k"},
    {"registration id too short",
     B("{\"enrolment_secret\": \"k\", \"registration_id\": \"0123456789abcde\"}"), STRATA_EPROTO,
     "registration_id: expected 16 to 64 bytes of letters, digits", NULL, NULL},
    {"registration id with a dot",
     B("{\"enrolment_secret\": \"k\", \"registration_id\": \"0123456789abcdef.\"}"), STRATA_EPROTO,
     "registration_id:", NULL, NULL},
    {"registration id a number", B("{\"enrolment_secret\": \"k\", \"registration_id\": 7}"),
     STRATA_EPROTO, "registration_id: expected a string", NULL, NULL},
    {"duplicate secret", B("{\"enrolment_secret\": \"a\", \"enrolment_secret\": \"b\"}"),
     STRATA_EPROTO, "duplicate", NULL, NULL},
    {"array body", B("[{\"enrolment_secret\": \"k\"}]"), STRATA_EPROTO, "expected a JSON object",
     NULL, NULL},
    {"bad UTF-8 in the secret", B("{\"enrolment_secret\": \"\xfe\"}"), STRATA_EPROTO,
     "not valid JSON", NULL, NULL},
    {"too deep", B("{\"x\":[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]], \"enrolment_secret\": \"k\"}"),
     STRATA_EPROTO, "nesting deeper than 16", NULL, NULL},
};

static void test_register_table(void)
{
    for (size_t i = 0; i < sizeof(register_cases) / sizeof(register_cases[0]); i++) {
        const register_case *c = &register_cases[i];
        srv_register_req req;
        memset(&req, 0xaa, sizeof(req));
        strata_diag d = {{0}};
        int rc = srv_request_register((const uint8_t *)c->body, c->len, NULL, &req, &d);
        check_outcome(c->what, rc, c->rc, &d, c->msg);
        if (rc < 0) {
            CU_ASSERT(all_zero(&req, sizeof(req)));
            continue;
        }
        CU_ASSERT_EQUAL(req.has_name, c->name != NULL);
        CU_ASSERT_STRING_EQUAL(req.name, c->name != NULL ? c->name : "");
        CU_ASSERT_EQUAL(req.has_secret, 1);
        CU_ASSERT_STRING_EQUAL(req.secret, c->secret);
    }
}

static void test_register_lengths(void)
{
    /* name: 64 printable bytes pass, 65 do not. */
    for (size_t n = SRV_NAME_MAX; n <= SRV_NAME_MAX + 1; n++) {
        char name[SRV_NAME_MAX + 2];
        memset(name, 'n', n);
        name[n] = '\0';
        char body[256];
        snprintf(body, sizeof(body), "{\"name\": \"%s\", \"enrolment_secret\": \"k\"}", name);
        srv_register_req req;
        memset(&req, 0xaa, sizeof(req));
        strata_diag d = {{0}};
        int rc = srv_request_register((uint8_t *)body, strlen(body), NULL, &req, &d);
        if (n <= SRV_NAME_MAX) {
            check_outcome("name of 64", rc, STRATA_OK, &d, NULL);
            CU_ASSERT_STRING_EQUAL(req.name, name);
        } else {
            check_outcome("name of 65", rc, STRATA_EPROTO, &d, "name: expected 0 to 64 bytes");
            CU_ASSERT(all_zero(&req, sizeof(req)));
        }
    }
    /* secret: 256 bytes pass, 257 do not; bytes, not characters, count. */
    for (size_t n = SRV_SECRET_MAX; n <= SRV_SECRET_MAX + 1; n++) {
        char *body = string_body("enrolment_secret", 's', n);
        CU_ASSERT_FATAL(body != NULL);
        srv_register_req req;
        memset(&req, 0xaa, sizeof(req));
        strata_diag d = {{0}};
        int rc = srv_request_register((uint8_t *)body, strlen(body), NULL, &req, &d);
        if (n <= SRV_SECRET_MAX) {
            check_outcome("secret of 256", rc, STRATA_OK, &d, NULL);
            CU_ASSERT_EQUAL(strlen(req.secret), n);
        } else {
            check_outcome("secret of 257", rc, STRATA_EPROTO, &d,
                          "enrolment_secret: expected 1 to 256 bytes");
            CU_ASSERT(all_zero(&req, sizeof(req)));
        }
        free(body);
    }
    char body[1024];
    int k = snprintf(body, sizeof(body), "{\"enrolment_secret\": \"");
    for (int i = 0; i < 129; i++) /* 129 two-byte characters: 258 bytes */
        k += snprintf(body + k, sizeof(body) - k, "\xc3\xa9");
    snprintf(body + k, sizeof(body) - k, "\"}");
    srv_register_req req;
    strata_diag d = {{0}};
    check_outcome("secret of 129 characters in 258 bytes",
                  srv_request_register((uint8_t *)body, strlen(body), NULL, &req, &d),
                  STRATA_EPROTO, &d, "enrolment_secret");

    /* The size limit comes first, with its own code; a custom limit applies. */
    char *big = string_body("enrolment_secret", 's', SRV_JSON_DEFAULT_MAX_BYTES);
    CU_ASSERT_FATAL(big != NULL);
    memset(&req, 0xaa, sizeof(req));
    check_outcome("body above the limit",
                  srv_request_register((uint8_t *)big, strlen(big), NULL, &req, &d), STRATA_ETOOBIG,
                  &d, "above the JSON limit of 65536");
    CU_ASSERT(all_zero(&req, sizeof(req)));
    free(big);
    srv_json_limits lim = {.max_bytes = 16, .max_depth = 16};
    check_outcome("custom limit",
                  srv_request_register(U("{\"enrolment_secret\": \"k\"}"), &lim, &req, &d),
                  STRATA_ETOOBIG, &d, "above the JSON limit of 16");
    CU_ASSERT_EQUAL(srv_request_register(NULL, 0, NULL, NULL, &d), STRATA_EINVAL);
}

/* ---- srv_request_reason -------------------------------------------------- */

typedef struct {
    const char *what;
    const char *body;
    size_t len;
    int rc;
    const char *msg;    /* a substring of the diag, or NULL */
    const char *reason; /* expected reason, NULL when absent */
} admin_case;

static const admin_case admin_cases[] = {
    {"empty body", B(""), STRATA_OK, NULL, NULL},
    {"empty object", B("{}"), STRATA_OK, NULL, NULL},
    {"reason", B("{\"reason\": \"maintenance window\"}"), STRATA_OK, NULL, "maintenance window"},
    {"empty reason", B("{\"reason\": \"\"}"), STRATA_OK, NULL, ""},
    {"reason in UTF-8", B("{\"reason\": \"Wartung f\xc3\xbcr Modell \\u00e9\\ud83d\\ude00\"}"),
     STRATA_OK, NULL, "Wartung f\xc3\xbcr Modell \xc3\xa9\xf0\x9f\x98\x80"},
    {"no-break space is printable", B("{\"reason\": \"a\\u00a0b\"}"), STRATA_OK, NULL,
     "a\xc2\xa0"
     "b"},
    {"only white space", B(" "), STRATA_EPROTO, "not valid JSON", NULL},
    {"null", B("null"), STRATA_EPROTO, "not valid JSON", NULL},
    {"array", B("[]"), STRATA_EPROTO, "expected a JSON object", NULL},
    {"reason a number", B("{\"reason\": 1}"), STRATA_EPROTO, "reason: expected a string", NULL},
    {"reason null", B("{\"reason\": null}"), STRATA_EPROTO, "reason: expected a string", NULL},
    {"reason with a newline", B("{\"reason\": \"a\\nb\"}"), STRATA_EPROTO,
     "reason: expected 0 to 200 bytes of text without control characters", NULL},
    {"reason with a tab", B("{\"reason\": \"a\\tb\"}"), STRATA_EPROTO, "reason:", NULL},
    {"reason with CR", B("{\"reason\": \"a\\rb\"}"), STRATA_EPROTO, "reason:", NULL},
    {"reason with DEL", B("{\"reason\": \"a\\u007f\"}"), STRATA_EPROTO, "reason:", NULL},
    {"reason with a C1 control", B("{\"reason\": \"a\\u0085b\"}"), STRATA_EPROTO, "reason:", NULL},
    {"reason with raw C1 bytes",
     B("{\"reason\": \"a\xc2\x9b"
       "b\"}"),
     STRATA_EPROTO, "reason:", NULL},
    {"reason with NUL", B("{\"reason\": \"a\\u0000\"}"), STRATA_EPROTO, "not valid JSON", NULL},
    {"unknown key", B("{\"reason\": \"x\", \"force\": true}"), STRATA_EPROTO,
     "unknown key \"force\"", NULL},
    {"duplicate reason", B("{\"reason\": \"x\", \"reason\": \"y\"}"), STRATA_EPROTO, "duplicate",
     NULL},
    {"bad UTF-8", B("{\"reason\": \"\x80\"}"), STRATA_EPROTO, "not valid JSON", NULL},
};

static void test_admin_table(void)
{
    for (size_t i = 0; i < sizeof(admin_cases) / sizeof(admin_cases[0]); i++) {
        const admin_case *c = &admin_cases[i];
        srv_reason_req req;
        memset(&req, 0xaa, sizeof(req));
        strata_diag d = {{0}};
        int rc = srv_request_reason((const uint8_t *)c->body, c->len, NULL, &req, &d);
        check_outcome(c->what, rc, c->rc, &d, c->msg);
        if (rc < 0) {
            CU_ASSERT(all_zero(&req, sizeof(req)));
            continue;
        }
        CU_ASSERT_EQUAL(req.has_reason, c->reason != NULL);
        CU_ASSERT_STRING_EQUAL(req.reason, c->reason != NULL ? c->reason : "");
    }
}

static void test_admin_lengths(void)
{
    /* 200 bytes pass and 201 do not, in ASCII and in two-byte characters. */
    for (int wide = 0; wide <= 1; wide++) {
        for (size_t n = SRV_REASON_MAX; n <= SRV_REASON_MAX + 2; n += 1 + wide) {
            char body[512];
            int k = snprintf(body, sizeof(body), "{\"reason\": \"");
            for (size_t i = 0; i < n; i += 1 + wide)
                k += snprintf(body + k, sizeof(body) - k, wide ? "\xc3\xa9" : "r");
            snprintf(body + k, sizeof(body) - k, "\"}");
            srv_reason_req req;
            memset(&req, 0xaa, sizeof(req));
            strata_diag d = {{0}};
            int rc = srv_request_reason((uint8_t *)body, strlen(body), NULL, &req, &d);
            if (n <= SRV_REASON_MAX) {
                check_outcome("reason of 200 bytes", rc, STRATA_OK, &d, NULL);
                CU_ASSERT_EQUAL(strlen(req.reason), n);
            } else {
                check_outcome("reason above 200 bytes", rc, STRATA_EPROTO, &d, "reason:");
                CU_ASSERT(all_zero(&req, sizeof(req)));
            }
        }
    }
    char *big = string_body("reason", 'r', SRV_JSON_DEFAULT_MAX_BYTES);
    CU_ASSERT_FATAL(big != NULL);
    srv_reason_req req;
    strata_diag d = {{0}};
    check_outcome("body above the limit",
                  srv_request_reason((uint8_t *)big, strlen(big), NULL, &req, &d), STRATA_ETOOBIG,
                  &d, "above the JSON limit");
    free(big);
    CU_ASSERT_EQUAL(srv_request_reason(NULL, 0, NULL, NULL, &d), STRATA_EINVAL);
}

/* ---- srv_secret_equal --------------------------------------------------- */

static void test_secret_equal(void)
{
    static const struct {
        const char *a, *b;
        int equal;
    } cases[] = {
        {"s3cret", "s3cret", 1},
        {"", "", 1},
        {"s3cret", "s3creT", 0},
        {"S3cret", "s3cret", 0},
        {"s3cre", "s3cret", 0},
        {"s3cret", "s3cre", 0},
        {"", "x", 0},
        {"x", "", 0},
        {NULL, "x", 0},
        {"x", NULL, 0},
        {NULL, NULL, 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        CU_ASSERT_EQUAL(srv_secret_equal(cases[i].a, cases[i].b), cases[i].equal);

    /* Every single-byte difference of a long secret is seen. */
    char a[SRV_SECRET_MAX + 1], b[SRV_SECRET_MAX + 1];
    memset(a, 'k', SRV_SECRET_MAX);
    a[SRV_SECRET_MAX] = '\0';
    memcpy(b, a, sizeof(a));
    CU_ASSERT_EQUAL(srv_secret_equal(a, b), 1);
    for (size_t i = 0; i < SRV_SECRET_MAX; i++) {
        b[i] = (char)0x80;
        CU_ASSERT_EQUAL(srv_secret_equal(a, b), 0);
        b[i] = 'k';
    }
}

int main(void)
{
    CU_TestInfo parse_tests[] = {
        {"table of bodies", test_parse_table},
        {"size limit, at and above", test_parse_size},
        {"depth limit, at and above; strings do not nest", test_parse_depth},
        {"arguments", test_parse_arguments},
        CU_TEST_INFO_NULL,
    };
    CU_TestInfo register_tests[] = {
        {"table of bodies", test_register_table},
        {"name and secret lengths, size limit", test_register_lengths},
        CU_TEST_INFO_NULL,
    };
    CU_TestInfo admin_tests[] = {
        {"table of bodies", test_admin_table},
        {"reason length, size limit", test_admin_lengths},
        CU_TEST_INFO_NULL,
    };
    CU_TestInfo secret_tests[] = {
        {"equality", test_secret_equal},
        CU_TEST_INFO_NULL,
    };
    CU_SuiteInfo suites[] = {
        {"json_parse", NULL, NULL, NULL, NULL, parse_tests},
        {"register", NULL, NULL, NULL, NULL, register_tests},
        {"admin", NULL, NULL, NULL, NULL, admin_tests},
        {"secret_equal", NULL, NULL, NULL, NULL, secret_tests},
        CU_SUITE_INFO_NULL,
    };
    return strata_test_run(suites);
}
