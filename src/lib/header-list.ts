/** Header fields as name/value pairs, in order, repeated names allowed. Read, never changed: lists may share pairs. */
export type HeaderList = Array<[string, string]>;
